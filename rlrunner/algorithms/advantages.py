"""Group-relative advantages (GRPO-style) for image and video rollouts.

Rollouts arrive in contiguous groups: rows ``[g·G, (g + 1)·G)`` share one prompt (G = ``group_size``).

Image (``grpo``)::

    A_i = (r_i - mean_group(r)) / (σ + eps)
    σ = std of the group ("group"), of the whole batch ("global", the official DiffusionNFT code), or 1 ("none")

Video (``grpo_video``), chunk rewards ``r[b, k]`` (k = latent-frame chunk)::

    "video": mean/std over all chunks of all rollouts of a group jointly, one advantage per chunk
    "frame": mean/std over the group separately for each chunk index k

Several rewards (``reward.aggregation: per_reward_normalized``): :func:`per_reward_normalized_advantages` z-scores
each reward within its group, sums them with their weights and normalises the sum over the batch (GDPO).

Standard deviations are population ones (``unbiased=False``, as ``np.std``). A group whose rewards are all
equal gets advantage exactly 0 (never NaN, never round-off noise divided by eps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Tensor = torch.Tensor

STD_MODES = ("group", "global", "none")
VIDEO_MODES = ("video", "frame")


def _grouped(rewards: Tensor, group_size: int, name: str) -> Tensor:
    """``[N, ...] -> [N // G, G, ...]``; raises when N is not a multiple of G."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards.dim() == 0 or rewards.shape[0] % group_size != 0:
        raise ValueError(
            f"{name} of shape {tuple(rewards.shape)}: the batch size must be a multiple of group_size={group_size}"
        )
    return rewards.reshape(rewards.shape[0] // group_size, group_size, *rewards.shape[1:])


def _normalise(centred: Tensor, std: Tensor, constant: Tensor, eps: float) -> Tensor:
    """centred / (std + eps), with 0 where the group is constant."""
    return torch.where(constant, torch.zeros_like(centred), centred / (std + eps))


def group_advantages(rewards: Tensor, group_size: int, *, std: str = "group", eps: float = 1e-6) -> Tensor:
    """Per-group normalised advantages for image recipes.

    Args:
        rewards: ``[N]`` rewards, N a multiple of ``group_size``, groups contiguous.
        group_size: G, rollouts per prompt.
        std: ``"group"`` (divide by the group's std), ``"global"`` (by the batch std, as the official code),
            ``"none"`` (mean-centring only).
        eps: added to the std.

    Returns:
        ``[N]`` float advantages ``(r - mean_group) / (std + eps)``.
    """
    if std not in STD_MODES:
        raise ValueError(f"unknown std mode {std!r}; valid: {list(STD_MODES)}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [N], got shape {tuple(rewards.shape)}")
    r = _grouped(rewards.float(), group_size, "rewards")  # [G_n, G]
    centred = r - r.mean(dim=1, keepdim=True)
    constant = (r.amax(dim=1, keepdim=True) == r.amin(dim=1, keepdim=True)).expand_as(r)
    if std == "group":
        sigma = r.std(dim=1, unbiased=False, keepdim=True)
    elif std == "global":
        sigma = r.std(unbiased=False)
    else:
        sigma, eps = torch.ones((), dtype=r.dtype, device=r.device), 0.0
    return _normalise(centred, sigma, constant, eps).reshape(-1)


def video_group_advantages(
    chunk_rewards: Tensor, group_size: int, mode: str = "video", *, eps: float = 1e-6
) -> Tensor:
    """Per-group normalised advantages for video rollouts with one reward per latent-frame chunk.

    Args:
        chunk_rewards: ``[B, K]`` chunk rewards, B a multiple of ``group_size``, groups contiguous.
        group_size: G, rollouts per prompt.
        mode: ``"video"`` normalises all ``G·K`` chunk rewards of a group jointly; ``"frame"`` normalises each
            chunk index k over the group's G rollouts separately.
        eps: added to the std.

    Returns:
        ``[B, K]`` float advantages, one per chunk (feed as ``adv`` ``[B, F]`` to ``nft_loss`` when K = F).
    """
    if mode not in VIDEO_MODES:
        raise ValueError(f"unknown video advantage mode {mode!r}; valid: {list(VIDEO_MODES)}")
    if chunk_rewards.dim() != 2:
        raise ValueError(f"chunk_rewards must be [B, K], got shape {tuple(chunk_rewards.shape)}")
    r = _grouped(chunk_rewards.float(), group_size, "chunk_rewards")  # [G_n, G, K]
    dims = (1, 2) if mode == "video" else (1,)
    centred = r - r.mean(dim=dims, keepdim=True)
    sigma = r.std(dim=dims, unbiased=False, keepdim=True)
    constant = (r.amax(dim=dims, keepdim=True) == r.amin(dim=dims, keepdim=True)).expand_as(r)
    return _normalise(centred, sigma, constant, eps).reshape(chunk_rewards.shape)


def per_reward_normalized_advantages(
    parts: Tensor, weights: Tensor, group_size: int, *, video_mode: str = "video", eps: float = 1e-6
) -> Tensor:
    """GDPO-style advantages of several rewards (Flow-Factory's default for multi-reward training).

    Each reward is z-scored within its group on its own, so a reward with a larger spread cannot drown the others::

        z_p = (r_p − mean_group(r_p)) / (std_group(r_p) + eps)        (0 for a group where r_p is constant)
        s   = Σ_p w_p · z_p
        A   = (s − mean_batch(s)) / (std_batch(s) + eps)               (0 when s spreads by <= 1e-5 over the batch)

    Args:
        parts: ``[N, P]`` raw scores of P rewards, or ``[N, P, K]`` chunk rewards of videos; groups contiguous.
        weights: ``[P]``, or ``[N, P]`` per row (a reward dropped for some rows has weight 0 there).
        group_size: G, rollouts per prompt.
        video_mode: for ``[N, P, K]``, how each reward is z-scored (``video_group_advantages``' ``mode``).
        eps: added to both standard deviations.

    Returns:
        ``[N]`` (or ``[N, K]``) float advantages.
    """
    if parts.dim() not in (2, 3):
        raise ValueError(f"parts must be [N, P] or [N, P, K], got shape {tuple(parts.shape)}")
    weights = weights.float().expand(parts.shape[:2])
    z = torch.stack([group_advantages(parts[:, p], group_size, eps=eps) if parts.dim() == 2
                     else video_group_advantages(parts[:, p], group_size, video_mode, eps=eps)
                     for p in range(parts.shape[1])], dim=1)
    s = (z * weights.reshape(weights.shape + (1,) * (z.dim() - 2))).sum(dim=1)
    # z-scores are O(1): a spread of s below 1e-5 is round-off of rewards that agree, not a signal to blow up
    constant = (s.amax() - s.amin() <= 1e-5).expand_as(s)
    return _normalise(s - s.mean(), s.std(unbiased=False), constant, eps)


@dataclass(frozen=True)
class AdvantageEstimator:
    """One ``algorithm.adv_type``: its function, the keyword ``algorithm.advantage_mode`` fills and that keyword's
    valid values."""

    function: Callable[..., Tensor]
    mode_keyword: str
    modes: tuple[str, ...]


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "grpo": AdvantageEstimator(group_advantages, "std", STD_MODES),
    "grpo_video": AdvantageEstimator(video_group_advantages, "mode", VIDEO_MODES),
}


def get_advantage_estimator(name: str) -> Callable[..., Tensor]:
    """Look up ``algorithm.adv_type``; a miss lists the valid names."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown adv_type {name!r}; valid: {sorted(ADVANTAGE_ESTIMATORS)}")
    return ADVANTAGE_ESTIMATORS[name].function


def estimate_advantages(adv_type: str, rewards: Tensor, group_size: int, mode: str) -> Tensor:
    """The advantages of ``rewards`` by estimator ``adv_type`` with ``mode`` (``algorithm.advantage_mode``) passed as
    the keyword that estimator names it by."""
    function = get_advantage_estimator(adv_type)  # a miss lists the valid names
    return function(rewards, group_size, **{ADVANTAGE_ESTIMATORS[adv_type].mode_keyword: mode})
