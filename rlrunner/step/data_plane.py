"""The per-step data plane, by name: how each rollout shard's result is cut where it is computed, and which of the
pieces go to the actor ranks, the env workers and the driver.

A rollout worker returns a :class:`~rlrunner.workers.rollout.RolloutOutput`; the cluster cuts it, in the worker's
process, with the part functions of :meth:`RolloutParts.cut` (``per_rank_parts``), so that the actor never receives
pixels and the driver only what it logs. :class:`RolloutParts` reads the cut parts back by name (the order of the
list is known here only):

- ``train(group)``: the rows actor data-parallel group ``group`` trains on
  (:class:`~rlrunner.step.sample_order.TrainPlan`), which every rank of that group fetches;
- ``scored``: pixels and prompts, for the env workers;
- ``logged``: the samples among the step's first ``runner.num_logged_samples`` that the driver writes.

With ``rollout.context_parallel_size`` ``k > 1``, ``k`` consecutive rollout ranks sample one shard together; the
first of them (the group's *leader*) returns the result and the others nothing, so only the leaders' parts are read.
No Ray here: a :class:`~rlrunner.cluster.base.PendingCall` is the cluster's abstract result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter, methodcaller
from typing import Any

import numpy as np

from rlrunner.cluster.base import Handle, PendingCall
from rlrunner.step.batch import Batch
from rlrunner.step.sample_order import TrainPlan

PartFunction = Callable[[Any], Any]


def _nothing(output: Any) -> None:
    """The part of a rollout rank that is not its group's leader: it returned nothing."""


@dataclass(frozen=True)
class RolloutParts:
    """The parts of one rollout round as the driver holds them (handles into the workers' results).

    ``pending``: the round's ``generate`` call, made with ``per_rank_parts`` from :meth:`per_rank_cuts`;
    ``train_groups``: actor data-parallel groups (0 for eval); ``context_parallel_size``: rollout ranks per shard.
    """

    pending: PendingCall
    train_groups: int
    context_parallel_size: int = 1

    @staticmethod
    def cut(plan: TrainPlan | None, offset: int, size: int, to_log: int) -> list[PartFunction]:
        """The part functions of the shard holding the step's samples ``[offset, offset + size)``: one training part
        per actor group (``plan``; none for eval), then the scored part, then the logged samples."""
        groups = range(plan.groups) if plan else range(0)
        for_actor = [methodcaller("train_rows", plan.group_rows(group, offset, size)) for group in groups]
        return [*for_actor, attrgetter("scored"), methodcaller("first", int(np.clip(to_log - offset, 0, size)))]

    @staticmethod
    def per_rank_cuts(plan: TrainPlan | None, offsets: list[int], sizes: list[int], to_log: int,
                      context_parallel_size: int = 1) -> list[list[PartFunction]]:
        """``per_rank_parts`` of a round: shard ``i`` is sampled by rollout ranks ``i·k .. i·k + k - 1``
        (``k = context_parallel_size``), cut by its leader; the other ranks' parts are empty."""
        per_rank = []
        for offset, size in zip(offsets, sizes):
            cuts = RolloutParts.cut(plan, offset, size, to_log)
            per_rank += [cuts] + [[_nothing] * len(cuts)] * (context_parallel_size - 1)
        return per_rank

    def _leaders(self, index: int) -> list[Handle[Any]]:
        return self.pending.part(index).handles()[::self.context_parallel_size]

    def train(self, group: int) -> list[Handle[Batch]]:
        """Actor group ``group``'s rows of every shard of the round, in sample order."""
        assert 0 <= group < self.train_groups, f"group {group} of {self.train_groups}"
        return self._leaders(group)

    def scored(self) -> list[Handle[Batch]]:
        """Every shard's scored part (uint8 pixels and prompts), for the env workers."""
        return self._leaders(self.train_groups)

    def logged(self) -> list[Batch]:
        """The logged samples of every shard, fetched (waits for the round's rollout)."""
        return self.pending.part(self.train_groups + 1).get()[::self.context_parallel_size]
