"""The sample-position contract, in one place: which samples each actor rank trains on, in what order, with what noise.

A training step's ``N`` samples are numbered in rollout order (round by round, rollout shard by shard, a prompt's
group contiguous): a sample's *index*. Then, depending only on (seed, step, ``N``, ``G`` = global batch size):

1. **train order**: ``order``, a permutation of the ``N`` indices seeded by (seed, ``"train-order"``, step);
   *position* p of the step trains sample ``order[p]``.
2. **optimizer windows**: optimizer step k trains positions ``[k·G, (k+1)·G)`` whatever the number of ranks ``n``;
   rank r takes the r-th ``G/n`` slice of each window (:func:`optimizer_step_shards`), in order.
3. **noise seeds**: a sample's training noise is seeded by (seed, ``"actor-noise"``, step, position, draw)
   (:func:`noise_seed`), never by rank; what its draws share (NFT's distinct noise levels) by (seed,
   ``"actor-levels"``, step, position) (:func:`level_seed`).
4. **rows per rank**: as all of this is known before the rollout, each rollout shard returns one training part per
   actor rank, the rows that rank trains on (:meth:`TrainPlan.shard_rows`); a rank joins its parts in sample order
   and :meth:`TrainPlan.local_index` puts them in its training order. No rank fetches another rank's rows.
5. **context parallelism** (``actor.context_parallel_size`` ``cp > 1``): the ``n`` actor ranks form ``n / cp``
   data-parallel *groups* of ``cp`` consecutive ranks that train the same samples (each computes its slice of the
   sequence), so everything above is per group: the windows are cut into ``n / cp`` slices, and a rollout shard
   returns one part per group, which each rank of the group fetches once.

So adapters do not depend on ``n``, and a rollout started a step early (``runner.rollout_ahead``) or replayed on
resume is cut the same way. Pure torch: no Ray, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlrunner.step.sizes import data_parallel_groups, optimizer_step_share
from rlrunner.utils.seeding import derive_seed


def optimizer_step_shards(num_samples: int, global_batch_size: int, world_size: int) -> list[torch.Tensor]:
    """Positions of each rank's samples: optimizer step k's window ``[k·G, (k+1)·G)`` cut into equal slices.

    Rank r gets ``[k·G + r·G/n, k·G + (r+1)·G/n)`` for every step k, in order, so that its k-th
    ``G/n``-sample piece belongs to optimizer step k and the same samples form each step whatever ``n``.
    Returns ``world_size`` int64 tensors of ``num_samples / world_size`` positions.
    """
    if num_samples % global_batch_size or global_batch_size % world_size:
        raise ValueError(f"{num_samples} samples cannot form whole optimizer steps of {global_batch_size} shared "
                         f"by {world_size} ranks")
    windows = torch.arange(num_samples).view(-1, world_size, optimizer_step_share(global_batch_size, world_size))
    return [windows[:, rank].reshape(-1) for rank in range(world_size)]


def train_order(seed: int, step: int, num_samples: int) -> torch.Tensor:
    """int64 ``[num_samples]``: the sample index trained at each position of global step ``step``."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "train-order", step))
    return torch.randperm(num_samples, generator=generator)


def noise_seed(seed: int, step: int, position: int, draw: int) -> int:
    """Seed of the training noise of the sample at ``position`` of step ``step`` (``draw``: the objective's draw)."""
    return derive_seed(seed, "actor-noise", step, position, draw)


def level_seed(seed: int, step: int, position: int) -> int:
    """Seed of what all draws of the sample at ``position`` of step ``step`` share (its noise levels)."""
    return derive_seed(seed, "actor-levels", step, position)


@dataclass(frozen=True)
class TrainPlan:
    """Who trains what in one step: ``order`` int64 ``[N]`` and ``positions[g]`` int64 ``[N / groups]`` of
    data-parallel group g, whose ``context_parallel_size`` ranks ``g·cp .. g·cp + cp - 1`` train the same samples
    (one rank per group without context parallelism)."""

    order: torch.Tensor
    positions: list[torch.Tensor]
    context_parallel_size: int = 1

    @classmethod
    def build(cls, seed: int, step: int, num_samples: int, global_batch_size: int, world_size: int,
              context_parallel_size: int = 1) -> TrainPlan:
        """``world_size`` actor ranks in groups of ``context_parallel_size``."""
        if world_size % context_parallel_size:
            raise ValueError(f"{world_size} actor ranks cannot form groups of context_parallel_size "
                             f"{context_parallel_size}")
        groups = data_parallel_groups(world_size, context_parallel_size)
        positions = optimizer_step_shards(num_samples, global_batch_size, groups)
        return cls(train_order(seed, step, num_samples), positions, context_parallel_size)

    @property
    def groups(self) -> int:
        """Data-parallel groups (each trains its own samples)."""
        return len(self.positions)

    @property
    def world_size(self) -> int:
        """Actor ranks."""
        return self.groups * self.context_parallel_size

    def group_of(self, rank: int) -> int:
        return rank // self.context_parallel_size

    def samples(self, rank: int) -> torch.Tensor:
        """int64 ``[N / groups]``: the sample indices rank ``rank`` trains on, in its training order."""
        return self.order[self.positions[self.group_of(rank)]]

    def group_positions(self, rank: int) -> torch.Tensor:
        """int64 ``[N / groups]``: the step positions (seeds of the training noise) of :meth:`samples`."""
        return self.positions[self.group_of(rank)]

    def shard_rows(self, rank: int, start: int, size: int) -> list[int]:
        """Rows (ascending) of the shard holding samples ``[start, start + size)`` that rank ``rank`` trains on."""
        mine = self.samples(rank)
        inside = mine[(mine >= start) & (mine < start + size)]
        return (inside.sort().values - start).tolist()

    def group_rows(self, group: int, start: int, size: int) -> list[int]:
        """:meth:`shard_rows` of the ranks of data-parallel group ``group``."""
        return self.shard_rows(group * self.context_parallel_size, start, size)

    def local_index(self, rank: int) -> torch.Tensor:
        """int64 ``[N / groups]``: where each of :meth:`samples` sits in the rank's parts joined in sample order."""
        mine = self.samples(rank)
        return torch.searchsorted(mine.sort().values, mine)
