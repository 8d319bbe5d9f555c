"""Env worker: scores decoded images or frames against their prompts with the recipe's reward."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlrunner.rewards import AsyncRewardScorer, RewardOutput, build_reward

SPLITS = ("train", "eval")


class EnvWorker:
    """Holds one reward (and its OCR engine) per split; ``score`` is the whole remote surface."""

    def __init__(self, env_cfg: Any, *, rank: int = 0, world_size: int = 1) -> None:
        self.scorers = {}
        for split in SPLITS:
            reward_cfg = env_cfg[split].reward
            self.scorers[split] = AsyncRewardScorer(build_reward(reward_cfg), num_workers=reward_cfg.num_workers)

    def score(self, images: torch.Tensor, prompts: list[str], split: str = "train") -> RewardOutput:
        """images: uint8 ``[B, H, W, 3]`` or ``[B, F, H, W, 3]``; returns the reward for each sample."""
        return self.scorers[split].submit(np.asarray(images), prompts).result()

    def close(self) -> None:
        for scorer in self.scorers.values():
            scorer.close()
