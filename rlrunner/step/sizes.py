"""The sizes of one training step, derived once: :class:`StepSizes`, built from the recipe and the placement.

The recipe checks, the runner, the actor, the memory plan and the simulator read these; none of them divides a
batch or a prompt count itself (``tests/step/test_sizes.py`` searches the package for such divisions). Building one
is the check that the sizes divide: each refusal is a :class:`~rlrunner.config.errors.RecipeError` naming the
settings whose product or quotient does not divide. Pure arithmetic: no Ray, no torch, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlrunner.config.errors import fail


def data_parallel_groups(ranks: int, context_parallel_size: int) -> int:
    """Groups of ``context_parallel_size`` consecutive ranks that train (or sample) their own samples."""
    return ranks // context_parallel_size


def rollout_rounds(prompts: int, rollout_groups: int, async_reward: bool) -> int:
    """Rounds a rollout of ``prompts`` is split into: 2 with ``runner.async_reward`` (round 1's reward is scored
    beside round 2's rollout) when both rounds share the prompts evenly over the rollout groups, else 1."""
    return 2 if async_reward and prompts % (2 * rollout_groups) == 0 else 1


@dataclass(frozen=True)
class StepSizes:
    """What one training step holds and how it is shared (the settings each comes from beside it)."""

    samples: int  # rolled out and trained per step: env.train.total_num_envs x env.train.rollout_epoch
    group_size: int  # samples per prompt: algorithm.group_size
    rollout_epochs: int  # env.train.rollout_epoch: prompt draws per step
    rollout_workers: int  # the placement's rollout devices
    rollout_cp: int  # rollout.context_parallel_size: devices that sample one shard together
    actor_ranks: int  # the placement's actor devices
    actor_cp: int  # actor.context_parallel_size: ranks that train the same samples
    global_batch_size: int  # actor.global_batch_size: samples per optimizer step
    micro_batch_size: int  # actor.micro_batch_size: samples per forward and backward of one rank
    async_reward: bool = False  # runner.async_reward: the rollout in 2 rounds where they share evenly

    @classmethod
    def of(cls, cfg: Any, placement: Any) -> StepSizes:
        """The sizes of ``cfg``'s step on ``placement`` (a :class:`~rlrunner.cluster.Placement`), checked."""
        return cls.from_counts(cfg, placement.num_workers("actor"), placement.num_workers("rollout"))

    @classmethod
    def from_counts(cls, cfg: Any, actor_ranks: int, rollout_workers: int) -> StepSizes:
        """The sizes of ``cfg``'s step with ``actor_ranks`` and ``rollout_workers`` devices; each size that does not
        divide stops the recipe, in the order a reader fixes them: the actor's groups and batches, then the
        rollout's groups and prompts, then the held-out prompts."""
        actor, train = cfg.actor, cfg.env.train
        sizes = cls(samples=train.total_num_envs * train.rollout_epoch, group_size=cfg.algorithm.group_size,
                    rollout_epochs=train.rollout_epoch, rollout_workers=rollout_workers,
                    rollout_cp=cfg.rollout.context_parallel_size, actor_ranks=actor_ranks,
                    actor_cp=actor.context_parallel_size, global_batch_size=actor.global_batch_size,
                    micro_batch_size=actor.micro_batch_size, async_reward=bool(cfg.runner.async_reward))
        sizes.check(cfg.env.eval.total_num_envs)
        return sizes

    def check(self, eval_prompts: int) -> None:
        """Refuse sizes that do not divide (one line naming the settings), ``eval_prompts`` included."""
        if self.actor_ranks % self.actor_cp:
            fail(f"actor.context_parallel_size={self.actor_cp} does not divide the {self.actor_ranks} actor devices "
                 f"into whole context-parallel groups")
        step = self.micro_batch_size * self.actor_groups
        if self.global_batch_size % step:
            fail(f"actor.global_batch_size={self.global_batch_size} is not divisible by actor.micro_batch_size="
                 f"{self.micro_batch_size} x {self.actor_groups} actor worker group(s) = {step} (the "
                 f"{self.actor_ranks} actor devices / actor.context_parallel_size={self.actor_cp})")
        if self.samples % self.global_batch_size:
            fail(f"one step rolls out env.train.total_num_envs x rollout_epoch = {self.samples} samples, not a "
                 f"multiple of actor.global_batch_size={self.global_batch_size}")
        if self.rollout_workers % self.rollout_cp:
            fail(f"rollout.context_parallel_size={self.rollout_cp} does not divide the {self.rollout_workers} "
                 f"rollout devices into whole groups")
        if self.prompts_per_epoch % self.rollout_groups:
            fail(f"env.train.total_num_envs / algorithm.group_size = {self.prompts_per_epoch} prompts per rollout "
                 f"epoch cannot be shared evenly by {self.rollout_groups} rollout worker group(s) (the "
                 f"{self.rollout_workers} rollout devices / rollout.context_parallel_size={self.rollout_cp})")
        # held-out prompts are shared unevenly when they must be (Runner: split_evenly), but every group needs one
        if eval_prompts < self.rollout_groups:
            fail(f"env.eval.total_num_envs={eval_prompts} is fewer than the {self.rollout_groups} rollout worker "
                 f"group(s); evaluate at least one prompt per group")

    @property
    def prompts(self) -> int:
        """Prompts of one step (each sampled ``group_size`` times)."""
        return self.samples // self.group_size

    @property
    def prompts_per_epoch(self) -> int:
        """Prompts of one rollout epoch: ``env.train.total_num_envs / algorithm.group_size``."""
        return self.prompts // self.rollout_epochs

    @property
    def rollout_groups(self) -> int:
        """Rollout shards of a round: groups of ``rollout.context_parallel_size`` devices."""
        return data_parallel_groups(self.rollout_workers, self.rollout_cp)

    @property
    def rollout_rounds(self) -> int:
        return rollout_rounds(self.prompts, self.rollout_groups, self.async_reward)

    @property
    def samples_per_rollout_group(self) -> int:
        """Samples one rollout group generates in a step (its shards of every round)."""
        return self.samples // self.rollout_groups

    @property
    def prompts_per_rollout_group(self) -> int:
        return self.prompts // self.rollout_groups

    @property
    def samples_per_rollout_call(self) -> int:
        """Samples one rollout group generates in one ``generate`` call (one round's shard)."""
        return self.samples // self.rollout_rounds // self.rollout_groups

    @property
    def prompts_per_rollout_call(self) -> int:
        return self.samples_per_rollout_call // self.group_size

    @property
    def actor_groups(self) -> int:
        """Actor data-parallel groups: each trains its own samples (its ``actor_cp`` ranks the same ones)."""
        return data_parallel_groups(self.actor_ranks, self.actor_cp)

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps per training step."""
        return self.samples // self.global_batch_size

    @property
    def samples_per_group(self) -> int:
        """Samples one actor group trains on in a step."""
        return self.samples // self.actor_groups

    @property
    def local_batch(self) -> int:
        """Samples one actor group trains on in one optimizer step."""
        return optimizer_step_share(self.global_batch_size, self.actor_groups)

    def lr_schedule_steps(self, max_steps: int) -> int:
        """The LR schedule's length: the optimizer steps of ``max_steps`` training steps."""
        return max_steps * self.optimizer_steps

    def steps_per_epoch(self, num_prompts: int) -> int:
        """Training steps to draw each of ``num_prompts`` training prompts once (``runner.max_epochs``)."""
        return math.ceil(num_prompts / self.prompts)


def optimizer_step_share(global_batch_size: int, groups: int) -> int:
    """Samples of one optimizer step that each of ``groups`` data-parallel groups trains on
    (:func:`rlrunner.step.sample_order.optimizer_step_shards` cuts the windows so)."""
    return global_batch_size // groups
