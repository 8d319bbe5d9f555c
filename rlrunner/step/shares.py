"""How the driver divides a step's work: prompts over rollout rounds and workers, samples over env workers and
their scorer threads (:func:`reward_slices`: reward work is divided here only, once).

Pure list arithmetic (no Ray, no torch), so the runner's bookkeeping can be tested on its own: every share is
made of index triples (:data:`Piece`), never of data. The runner swaps a piece's shard number for the
:class:`~rlrunner.cluster.Handle` of that shard's result; the env worker receives the values.
Which rows each actor rank trains on is :mod:`rlrunner.step.sample_order`.
"""

from __future__ import annotations

import math

import numpy as np

#: ``(shard, start, stop)``: samples ``start:stop`` of rollout shard number ``shard`` (indices, not data).
Piece = tuple[int, int, int]


def split_evenly(items: list, parts: int) -> list[list]:
    """``parts`` consecutive shares of ``items``, the first ``len % parts`` one longer: 10 prompts on 3 workers: 4, 3, 3."""
    size, extra = divmod(len(items), parts)
    starts = [i * size + min(i, extra) for i in range(parts + 1)]
    return [items[starts[i]:starts[i + 1]] for i in range(parts)]


def env_shares(sizes: list[int], parts: int) -> list[list[Piece]]:
    """Consecutive shares of ``ceil(total / parts)`` samples (the last ones may be shorter or empty) of shards of
    ``sizes`` samples, each as pieces ``(shard, start, stop)``; an empty share is one empty piece of shard 0."""
    total = sum(sizes)
    size, offsets = math.ceil(total / parts), np.cumsum([0, *sizes[:-1]]).tolist()
    shares = []
    for lo, hi in ((i * size, min((i + 1) * size, total)) for i in range(parts)):
        shares.append([(i, max(lo - o, 0), min(hi - o, n)) for i, (o, n) in enumerate(zip(offsets, sizes))
                       if o < hi and lo < o + n] or [(0, 0, 0)])
    return shares


def reward_slices(sizes: list[int], env_workers: int, threads: int) -> list[list[list[Piece]]]:
    """The one split of a rollout round's samples (shards of ``sizes``) for scoring: ``env_workers × threads``
    consecutive slices (:func:`env_shares`), env worker i taking the i-th ``threads`` of them, one per scorer thread
    (``reward.num_workers``). Empty slices are dropped, but each worker keeps at least one (possibly empty) slice."""
    slices = env_shares(sizes, env_workers * threads)
    mine = [slices[i * threads:(i + 1) * threads] for i in range(env_workers)]
    return [[s for s in own if s[0][1] < s[0][2] or len(s) > 1] or own[:1] for own in mine]
