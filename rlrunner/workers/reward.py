"""The reward worker (the placement's ``env`` component, RLinf's name): scores decoded images or frames against
their prompts with the recipe's reward."""

from __future__ import annotations

import itertools
from concurrent.futures import Future
from typing import Any

import numpy as np

from rlrunner.config.paths import node_paths
from rlrunner.rewards import AsyncRewardScorer, RewardOutput, build_reward
from rlrunner.step.batch import Batch
from rlrunner.workers.guards import WatchedReward, build_guards

SPLITS = ("train", "eval")


def reward_settings(env_cfg: Any, watch_cfg: Any = None) -> Any:
    """What a reward worker is built from: each split's ``reward`` section of the recipe's ``env``, and the
    reward-hacking watch's (``runner.watch``; None: no watch), nothing more, so that no path of the log folder
    (``video_cfg``) reaches a worker."""
    from omegaconf import OmegaConf

    settings = OmegaConf.create({split: {"reward": env_cfg[split].reward} for split in SPLITS})
    if watch_cfg is not None and watch_cfg.enabled:
        settings.watch = watch_cfg
    return settings


class RewardWorker:
    """Holds one reward (and its OCR engine) per split.

    Scoring is asynchronous inside the worker: ``submit`` returns a ticket at once and the reward's scorer
    threads work while the driver goes on (e.g. with the next rollout round); ``collect`` waits for the result.
    This overlaps reward and rollout with every backend, in-process included. The worker scores the slices the
    driver cut (:func:`rlrunner.step.shares.reward_slices`) as they come, one per scorer thread, never re-splitting.
    """

    @staticmethod
    def node_paths(env_cfg: Any, *args: Any, **kwargs: Any) -> dict[str, str]:
        """The local files and folders the rewards read (token and key files, model folders, heads): checked on
        this worker's node before it starts (rlrunner.config.paths), with the same one line as the model's."""
        return node_paths("env", env_cfg, "env")

    def __init__(self, env_cfg: Any, *, rank: int = 0, world_size: int = 1) -> None:
        self.scorers = {}
        for split in SPLITS:
            reward_cfg = env_cfg[split].reward
            reward = build_reward(reward_cfg)
            if split == "eval" and "watch" in env_cfg:  # the eval's samples are also the guards' (workers/guards.py)
                reward = WatchedReward(reward, build_guards(env_cfg.watch), features=env_cfg.watch.diversity)
            self.scorers[split] = AsyncRewardScorer(reward, num_workers=reward_cfg.num_workers)
        self._pending: dict[int, Future] = {}
        self._tickets = itertools.count()
        self.metadata: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}

    def set_prompt_metadata(self, metadata: dict[str, list[dict[str, Any]]]) -> None:
        """Per split, each row's metadata (:attr:`PromptSet.metadata <rlrunner.data.prompts.PromptSet>`), for the
        rewards that use it; sent once at start. A sample names its row (meta ``rows``)."""
        self.metadata.update(metadata)

    def submit(self, slices: list[list[tuple[Batch, int, int]]], split: str = "train") -> int:
        """Start scoring ``slices``, each on its own scorer thread: a slice is pieces ``(part, start, stop)``, samples
        ``start:stop`` of a rollout part, joined in order; returns a ticket for the outputs of all slices in order.
        A part holds uint8 ``images`` ``[B, H, W, 3]`` (or frames ``[B, F, H, W, 3]``) and meta ``prompts`` and
        ``rows`` (:attr:`RolloutOutput.scored <rlrunner.workers.rollout.RolloutOutput>`)."""
        batches = [Batch.cat([part.select(slice(start, stop)) for part, start, stop in pieces]) for pieces in slices]
        ticket = next(self._tickets)
        table = self.metadata[split] if self.scorers[split].reward.uses_metadata else None
        self._pending[ticket] = self.scorers[split].submit_all(
            [(np.asarray(batch.tensors["images"]), batch.meta["prompts"],
              None if table is None else [table[row] for row in batch.meta["rows"]]) for batch in batches])
        return ticket

    def collect(self, ticket: int) -> RewardOutput:
        """The reward of a submitted batch (waits for it)."""
        return self._pending.pop(ticket).result()

    def close(self) -> None:
        for scorer in self.scorers.values():
            scorer.close()
