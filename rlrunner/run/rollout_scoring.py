"""A rollout and its scoring, round by round: rollout workers sample, env (reward) workers score, and scoring round k
overlaps the rollout of round k+1; what the driver holds of it is handles (:class:`RolloutHandles`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from omegaconf import DictConfig

from rlrunner.cluster import Handle
from rlrunner.rewards import RewardOutput
from rlrunner.step.batch import Batch
from rlrunner.step.data_plane import RolloutParts
from rlrunner.step.device_turns import DeviceTurns
from rlrunner.step.sample_order import TrainPlan
from rlrunner.step.shares import reward_slices, split_evenly
from rlrunner.step.sizes import StepSizes, rollout_rounds
from rlrunner.tracking.logger import StepTimer


@dataclass
class RolloutHandles:
    """A rollout as the driver holds it: handles, never the tensors, except the few samples it logs."""

    # train[g]: actor group g's rows of every rollout shard's RolloutOutput.train, in sample order (none for eval)
    train: list[list[Handle[Batch]]]
    plan: TrainPlan | None  # who trains what (training rollouts only)
    logged: Batch  # images and prompts of the first runner.num_logged_samples samples (none when not logging)
    num_samples: int


class RolloutScoring:
    """Runs rollouts on the rollout group and scores them on the env group, for the runner.

    ``prompts``: each split's prompt texts; ``sizes``: the step's sizes; ``turns``: the collocated groups' device
    turns.
    """

    def __init__(self, cfg: DictConfig, sizes: StepSizes, turns: DeviceTurns, rollout: Any, env: Any,
                 prompts: dict[str, list[str]]) -> None:
        self.cfg, self.sizes, self.turns, self.rollout, self.env = cfg, sizes, turns, rollout, env
        self.prompts = prompts

    def __call__(self, rows: list[int], group_size: int, mode: str, timer: StepTimer, step: int,
                 to_log: int) -> tuple[RolloutHandles, RewardOutput]:
        """Sample ``group_size`` images for each prompt (``rows`` of the split's prompt set) and score them; the driver
        fetches the first ``to_log`` samples. Each sample carries its row, and with it its metadata, to the reward.

        Splitting, once each: the prompts into rollout rounds (2 with ``runner.async_reward``), a round into one
        shard per rollout group (``rollout.context_parallel_size`` workers), its samples into one slice per scorer
        thread of each env worker (:meth:`submit_reward`), and (training) each shard's rows into one part per actor
        group, by the step's :class:`TrainPlan` (it depends only on the seed and ``step``). Each shard's result stays
        with its worker, cut there into the named parts of :class:`RolloutParts`; the driver holds :class:`Handle` s
        and fetches only the samples it logs.
        """
        self.turns.hand_to("rollout")
        rollout_cp, split = self.sizes.rollout_cp, "train" if mode == "train" else "eval"
        n_shards = self.sizes.rollout_groups
        texts = self.prompts[split]
        rounds = split_evenly(rows, rollout_rounds(len(rows), n_shards, self.cfg.runner.async_reward))
        plan = None
        if mode == "train":
            plan = TrainPlan.build(self.cfg.runner.seed, step, len(rows) * group_size, self.sizes.global_batch_size,
                                   self.sizes.actor_ranks, self.sizes.actor_cp)
        train: list[list[Handle[Batch]]] = [[] for _ in range(plan.groups if plan else 0)]
        logged: list[Batch] = []
        tickets, start = [], 0
        for index, round_rows in enumerate(rounds):
            shards = split_evenly(round_rows, n_shards)
            sizes = [len(shard) * group_size for shard in shards]
            offsets = np.cumsum([start, *sizes[:-1]]).tolist()
            with timer("rollout"):
                parts = RolloutParts(self.rollout.scatter_async(
                    "generate", [([texts[r] for r in shard], group_size, step, index, mode, shard)
                                 for shard in shards for _ in range(rollout_cp)],
                    per_rank_parts=RolloutParts.per_rank_cuts(plan, offsets, sizes, to_log, rollout_cp)),
                    len(train), rollout_cp)
                logged += parts.logged()  # waits for the round's rollout
            for group, handles in enumerate(train):
                handles += parts.train(group)
            tickets.append(self.submit_reward(parts.scored(), sizes, split))
            start += sum(sizes)
            if not self.cfg.runner.async_reward:
                with timer("reward"):
                    tickets[-1] = self.collect_reward(tickets[-1])
        with timer("reward"):
            rewards = [t if isinstance(t, RewardOutput) else self.collect_reward(t) for t in tickets]
        return RolloutHandles(train, plan, Batch.cat(logged), start), RewardOutput.concat(rewards)

    def submit_reward(self, scored: list[Handle[Batch]], sizes: list[int], split: str) -> list[int]:
        """Hand the env workers one rollout round's samples, cut once (:func:`reward_slices`) into a slice per scorer
        thread of every env worker, as pieces ``(handle, start, stop)`` of the rollout shards' scored parts
        (``sizes`` samples each); returns their tickets."""
        threads = self.cfg.env[split].reward.num_workers
        per_worker = reward_slices(sizes, self.env.world_size, threads)
        return self.env.scatter("submit", [([[(scored[i], lo, hi) for i, lo, hi in piece] for piece in slices], split)
                                           for slices in per_worker])

    def collect_reward(self, tickets: list[int]) -> RewardOutput:
        return RewardOutput.concat(self.env.scatter("collect", [(t,) for t in tickets]))
