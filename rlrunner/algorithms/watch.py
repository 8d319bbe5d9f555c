"""The reward-hacking watch's math (docs/reward_hacking.md): how varied a set of samples is, and the alarm rule on
metric histories. No I/O, no state: the run's watch (:mod:`rlrunner.run.watch`) keeps the histories.

Diversity works on small pixel features (:func:`sample_features`: each image averaged down to ``size x size`` RGB
cells, values in [0, 1]); the distance of two samples is the root-mean-square difference of their features, so it
is 0 for identical samples and 1 between an all-black and an all-white image.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

FEATURE_SIZE = 16  # cells per side: 768 numbers per image, enough to tell a flat image from a drawn one
VIDEO_FRAMES = 4  # frames of a video the features take, evenly spaced (first and last included)


def sample_features(images: torch.Tensor, size: int = FEATURE_SIZE) -> torch.Tensor:
    """Pixel features of each sample: ``images`` uint8 (or float in [0, 1]) ``[B, H, W, 3]``, or video frames
    ``[B, F, H, W, 3]`` (:data:`VIDEO_FRAMES` of them are taken), averaged down to ``[B, size * size * 3]``
    (video: times the frames taken) float32 in [0, 1]."""
    x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    if x.ndim == 4:
        x = x[:, None]
    frames = torch.linspace(0, x.shape[1] - 1, min(VIDEO_FRAMES, x.shape[1])).round().long()
    x = x[:, frames]  # [B, F', H, W, C]
    b, f, h, w, c = x.shape
    cells = F.adaptive_avg_pool2d(x.permute(0, 1, 4, 2, 3).reshape(b * f, c, h, w), size)
    return cells.reshape(b, -1)


def pairwise_distances(features: torch.Tensor) -> torch.Tensor:
    """``[N, N]`` root-mean-square differences between the rows of ``features`` ``[N, D]``."""
    x = features.double()
    return torch.cdist(x, x) / x.shape[1] ** 0.5


def _mean_off_diagonal(distances: torch.Tensor) -> float:
    """The mean of ``distances`` ``[G, k, k]`` over the pairs of distinct samples of each of the G sets."""
    g, k, _ = distances.shape
    return float(distances.sum() / (g * k * (k - 1)))  # the diagonal is 0


def within_group_diversity(features: torch.Tensor, group_size: int) -> float:
    """Mean pairwise distance between the samples of one prompt's group, averaged over the groups (contiguous
    groups of ``group_size`` >= 2 rows of ``features`` ``[N, D]``): 0 when each prompt gets one image again and
    again, whatever the prompts' images are."""
    if group_size < 2 or features.shape[0] % group_size:
        raise ValueError(f"within-group diversity needs groups of >= 2 samples that divide {features.shape[0]}; "
                         f"got group_size={group_size}")
    groups = features.reshape(-1, group_size, features.shape[1]).double()
    return _mean_off_diagonal(torch.cdist(groups, groups) / features.shape[1] ** 0.5)


def across_prompt_diversity(features: torch.Tensor, group_size: int = 1) -> float:
    """Mean distance between samples of different prompts (contiguous groups of ``group_size`` rows of ``features``
    ``[N, D]``; 1: one sample per prompt, as an eval draws): 0 when every prompt gets the same image, such as a flat
    image that a compressibility reward pays for."""
    n = features.shape[0]
    if n < 2 * group_size or n % group_size:
        raise ValueError(f"across-prompt diversity needs >= 2 prompts' groups of {group_size} in {n} samples")
    prompt = torch.arange(n) // group_size
    other = prompt[:, None] != prompt[None, :]
    return float(pairwise_distances(features)[other].mean())


def diversity(features: torch.Tensor, group_size: int) -> float:
    """The watch's diversity: within each prompt's group where groups have >= 2 samples, else across prompts."""
    if group_size >= 2:
        return within_group_diversity(features, group_size)
    return across_prompt_diversity(features)


@dataclass(frozen=True)
class AlarmRule:
    """When a guard says the training reward is being gamed: the training reward rose by at least
    ``min_reward_rise`` (the mean of its last ``window`` steps against the mean of its first ``window``) while the
    guard fell by at least ``max_drop`` of its first value (``(g_0 - g_now) / |g_0|``). Both must hold at the same
    eval: a guard that falls while the training reward falls too is a run that is failing, not one being gamed
    (the reasoning and the numbers behind the defaults: docs/reward_hacking.md)."""

    max_drop: float = 0.5
    min_reward_rise: float = 0.02
    window: int = 5

    def reward_rise(self, train_rewards: list[float]) -> float:
        """The training reward's rise since the run's first steps (0 with no steps yet)."""
        if not train_rewards:
            return 0.0
        k = min(self.window, len(train_rewards))
        return sum(train_rewards[-k:]) / k - sum(train_rewards[:k]) / k

    @staticmethod
    def guard_drop(guard: list[float]) -> float:
        """How far a guard fell from its first value, as a fraction of it (negative: it rose; 0 before a second
        value, or when the first value is 0 and nothing can fall below it)."""
        if len(guard) < 2 or guard[0] == 0:
            return 0.0
        return (guard[0] - guard[-1]) / abs(guard[0])

    def fires(self, train_rewards: list[float], guard: list[float]) -> bool:
        """Whether the rule fires on a guard's values at each eval (``guard``, first = the run's first eval) and the
        training reward of each step so far (``train_rewards``)."""
        return self.reward_rise(train_rewards) >= self.min_reward_rise and self.guard_drop(guard) >= self.max_drop
