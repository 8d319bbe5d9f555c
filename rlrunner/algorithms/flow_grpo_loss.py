"""Flow-GRPO (Liu et al., "Flow-GRPO: Training Flow Matching Models via Online RL", arXiv 2505.05470).

Rectified flow ``x_σ = (1 − σ)·x0 + σ·ε`` (σ = 1 noise), velocity ``v = ε − x0``. The deterministic sampler
integrates ``dx = v·dσ``. Flow-GRPO turns it into an SDE with the same marginals, so that each step is a Gaussian
policy whose log-density GRPO can use (paper eq. 8, in the sampler's direction: ``dt = σ_{i+1} − σ_i < 0``)::

    std_i  = a·sqrt(σ_i / (1 − σ_i))                       a = noise_level; σ = 1 uses σ_max (the grid's σ_1)
    mean_i = x_i·(1 + std_i²/(2σ_i)·dt) + v_θ(x_i, σ_i)·(1 + std_i²·(1 − σ_i)/(2σ_i))·dt
    x_{i+1} = mean_i + std_i·sqrt(−dt)·ε,   ε ~ N(0, I)
    log π_θ(x_{i+1} | x_i) = mean over elements of log N(x_{i+1}; mean_i, (std_i·sqrt(−dt))²)

With a = 0 the step is Euler's ``x + v·dt``. GRPO's clipped objective per trained step, with the group-relative
advantage A (clipped to ±adv_clip_max) and the ratio r = exp(log π_θ − log π_old)::

    L = mean(max(−A·r, −A·clip(r, 1 − ε_clip, 1 + ε_clip))) + β·mean(‖mean_θ − mean_ref‖² / (2·std²))

(the KL term is the closed-form KL of the two Gaussian steps, ``mean_ref`` from the reference model).
Flow-GRPO-Fast (the official ``train_sd3_fast.py``) samples with the SDE only in a window of a few consecutive
early steps and the ODE elsewhere, and trains only those steps.

Pure torch; the objective that wires this to the workers is :mod:`rlrunner.objectives.flow_grpo`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from rlrunner.algorithms.samplers import VelocityFn

Tensor = torch.Tensor


def _per_sample(value: Tensor, like: Tensor) -> Tensor:
    """``[B]`` -> ``[B, 1, ...]``, broadcastable against ``like`` ``[B, ...]``."""
    return value.reshape(-1, *([1] * (like.dim() - 1)))


def sde_step_logprob(
    v: Tensor,
    x: Tensor,
    sigma: Tensor,
    sigma_next: Tensor,
    sigma_max: float,
    noise_level: float,
    prev_sample: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One Euler–Maruyama step of Flow-GRPO's SDE from σ to σ_next < σ, and the log-density of its result.

    Args:
        v: ``[B, ...]`` velocity ``v(x, σ)``.
        x: ``[B, ...]`` state at σ.
        sigma, sigma_next: ``[B]`` noise levels per sample, ``sigma_next < sigma``, ``sigma > 0``.
        sigma_max: stands in for σ where σ = 1 in ``std``'s ``1 − σ`` (the official code: the grid's ``σ_1``).
        noise_level: ``a``; 0 gives Euler's ``x + v·dt`` (its log-prob is then undefined).
        prev_sample: ``[B, ...]`` the state at σ_next whose log-density to return (training); None draws it.
        generator: seeds the draw of ``ε`` (on ``x``'s device).

    Returns:
        ``(prev_sample [B, ...], log_prob [B], mean [B, ...], std [B, 1, ...])``, float32: ``log_prob`` is the mean
        over every axis but the batch of ``log N(prev_sample; mean, (std·sqrt(−dt))²)`` with ``prev_sample``
        detached, so its gradient flows through ``mean`` only; ``std`` is the SDE's ``std_i`` (not times
        ``sqrt(−dt)``), as the KL term of :func:`grpo_loss` takes it.
    """
    v, x = v.float(), x.float()
    sigma, sigma_next = _per_sample(sigma.float(), x), _per_sample(sigma_next.float(), x)
    dt = sigma_next - sigma
    std = torch.sqrt(sigma / (1 - torch.where(sigma == 1, torch.full_like(sigma, sigma_max), sigma))) * noise_level
    mean = x * (1 + std**2 / (2 * sigma) * dt) + v * (1 + std**2 * (1 - sigma) / (2 * sigma)) * dt
    step_std = std * torch.sqrt(-dt)
    if prev_sample is None:
        noise = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        prev_sample = mean + step_std * noise
    prev_sample = prev_sample.float()
    log_density = (-((prev_sample.detach() - mean) ** 2) / (2 * step_std**2) - torch.log(step_std)
                   - 0.5 * math.log(2 * math.pi))
    return prev_sample, log_density.mean(dim=tuple(range(1, x.dim()))), mean, std


def grpo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    adv: Tensor,
    *,
    clip_range: float,
    adv_clip_max: float,
    mean: Tensor | None = None,
    ref_mean: Tensor | None = None,
    std: Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO's clipped policy loss on one trained step per sample, plus the KL to the reference policy.

    Args:
        log_prob: ``[B]`` log π_θ of the stored next state (with gradient).
        old_log_prob: ``[B]`` log π_old of it, recorded by the rollout.
        adv: ``[B]`` advantages, clipped here to ``±adv_clip_max``.
        clip_range: ε_clip of the ratio.
        mean, ref_mean: ``[B, ...]`` the step's Gaussian means under θ and the reference model; ``std``:
            ``[B, 1, ...]`` (or broadcastable) the SDE's ``std_i``. The KL term is added when all three are
            given and ``kl_coef > 0``: ``kl_coef·mean_B(mean_elements((mean − ref_mean)²) / (2·std²))``.

    Returns:
        ``(loss, metrics)``: ``policy_loss`` (the clipped term), ``approx_kl`` (``½·mean((log π_θ − log π_old)²)``),
        ``clip_frac`` (share of samples with ``|r − 1| > clip_range``), ``kl`` (the unweighted KL term, 0 when off).
    """
    adv = adv.float().clamp(-adv_clip_max, adv_clip_max)
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - clip_range, 1 + clip_range)
    policy_loss = torch.maximum(unclipped, clipped).mean()
    loss, kl = policy_loss, torch.zeros(())
    if kl_coef > 0 and mean is not None and ref_mean is not None and std is not None:
        squared = ((mean - ref_mean) ** 2).mean(dim=tuple(range(1, mean.dim())))
        kl = (squared / (2 * std.reshape(-1) ** 2)).mean()
        loss = policy_loss + kl_coef * kl
    with torch.no_grad():
        metrics = {
            "policy_loss": policy_loss.item(),
            "approx_kl": (0.5 * (log_prob - old_log_prob) ** 2).mean().item(),
            "clip_frac": ((ratio - 1).abs() > clip_range).float().mean().item(),
            "kl": kl.item(),
        }
    return loss, metrics


class SDETrajectory(NamedTuple):
    """The recorded steps of :func:`sde_sample`, ``K`` per sample in step order.

    ``x``: ``[B, K, ...]`` float32 states before each recorded step; ``x_next``: after it; ``log_prob``:
    ``[B, K]`` float32, log π of ``x_next`` given ``x``; ``step``: int64 ``[B, K]``, the step index ``i`` (the
    step goes from ``sigmas[i]`` to ``sigmas[i + 1]``).
    """

    x: Tensor
    x_next: Tensor
    log_prob: Tensor
    step: Tensor


def sde_sample(
    velocity_fn: VelocityFn,
    noise: Tensor,
    sigmas: Tensor,
    sde_steps: Tensor,
    noise_level: float,
    generator: torch.Generator | None = None,
    record_steps: Tensor | None = None,
) -> tuple[Tensor, SDETrajectory]:
    """Integrate from ``noise`` (σ = sigmas[0]) to sigmas[-1]: :func:`sde_step_logprob` on each sample's SDE steps,
    Euler's ``x + v·dt`` on the others.

    Args:
        velocity_fn: ``(x [B, ...] in noise's dtype, σ [B] float32) -> v [B, ...]``.
        noise: ``[B, ...]`` start state.
        sigmas: ``[N + 1]`` decreasing grid, ``sigmas[0] = 1``.
        sde_steps: bool ``[B, N]`` (or ``[N]``, shared): which steps of each sample are SDE steps.
        noise_level: the SDE's ``a``.
        generator: draws the SDE noise, one ``[B, ...]`` draw per step where any sample is an SDE step.
        record_steps: bool ``[B, N]``, SDE steps whose states and log-probs to return, the same number ``K`` per
            sample (default: every SDE step).

    Returns:
        x0 ``[B, ...]`` in noise's dtype, and the recorded steps (:class:`SDETrajectory`). The update math runs
        in float32.
    """
    batch, num_steps = noise.shape[0], sigmas.numel() - 1
    sde_steps = sde_steps.to(noise.device).bool().expand(batch, num_steps)
    record_steps = sde_steps if record_steps is None else record_steps.to(noise.device).bool().expand(batch, num_steps)
    if (record_steps & ~sde_steps).any():
        raise ValueError("record_steps must be a subset of sde_steps: an ODE step has no log-probability")
    counts = record_steps.sum(dim=1)
    if (counts != counts[0]).any():
        raise ValueError(f"record_steps must mark the same number of steps per sample, got {counts.tolist()}")
    num_recorded = int(counts[0])
    x = noise.float()
    recorded_x = x.new_empty((batch, num_recorded, *x.shape[1:]))
    recorded_x_next, recorded_log_prob = torch.empty_like(recorded_x), x.new_empty((batch, num_recorded))
    column = torch.cumsum(record_steps.long(), dim=1) - 1  # where step i of a sample goes among its records
    grid = sigmas.detach().double().cpu().tolist()  # Python floats, as the ODE samplers (no device sync)
    for i in range(num_steps):
        sigma, sigma_next = (torch.full((batch,), s, device=x.device) for s in grid[i:i + 2])
        v = velocity_fn(x.to(noise.dtype), sigma).float()
        x_next = x + (grid[i + 1] - grid[i]) * v  # Euler, as rlrunner.algorithms.samplers: the ODE steps
        sde_rows = sde_steps[:, i]
        if sde_rows.any():
            sde_next, log_prob, _, _ = sde_step_logprob(v, x, sigma, sigma_next, grid[1], noise_level,
                                                        generator=generator)
            x_next = torch.where(_per_sample(sde_rows, x), sde_next, x_next)
            rows = record_steps[:, i].nonzero().squeeze(1)
            recorded_x[rows, column[rows, i]] = x[rows]
            recorded_x_next[rows, column[rows, i]] = x_next[rows]
            recorded_log_prob[rows, column[rows, i]] = log_prob[rows]
        x = x_next
    steps = torch.arange(num_steps, device=noise.device).expand(batch, num_steps)
    recorded_step = steps[record_steps].reshape(batch, num_recorded)
    return x.to(noise.dtype), SDETrajectory(recorded_x, recorded_x_next, recorded_log_prob, recorded_step)


def window_range(configured: Any, num_steps: int) -> tuple[int, int]:
    """The steps ``[first, end)`` an SDE window lies in: ``configured`` (a pair), or the first half
    ``(0, num_steps // 2)`` when it is None, as the official Fast configs."""
    return tuple(configured) if configured else (0, num_steps // 2)


def sde_window(batch: int, num_steps: int, window_size: int, window_range: tuple[int, int],
               generator: torch.Generator | None = None, device: torch.device | str | None = None) -> Tensor:
    """Flow-GRPO-Fast's SDE steps: per sample, ``window_size`` consecutive steps starting at a uniform
    ``start ∈ [lo, hi − window_size]`` (``window_range = (lo, hi)``), as ``bool [B, num_steps]``;
    ``window_size`` 0: every step (plain Flow-GRPO)."""
    if window_size == 0:
        return torch.ones((batch, num_steps), dtype=torch.bool, device=device)
    low, high = window_range
    if not (0 <= low <= high - window_size and high <= num_steps):
        raise ValueError(f"SDE window of {window_size} steps does not fit in range {window_range} of {num_steps} steps")
    start = torch.randint(low, high - window_size + 1, (batch, 1), generator=generator, device=device)
    steps = torch.arange(num_steps, device=device)
    return (steps >= start) & (steps < start + window_size)


def choose_steps(sde_steps: Tensor, count: int, generator: torch.Generator | None = None) -> Tensor:
    """``count`` of each sample's SDE steps (bool ``[B, N]``) drawn uniformly without replacement, as
    bool ``[B, N]``: the steps a sample trains on (``timestep_fraction``)."""
    available = sde_steps.sum(dim=1)
    if (available < count).any():
        raise ValueError(f"cannot choose {count} steps among {available.min().item()} SDE steps")
    scores = torch.rand(sde_steps.shape, generator=generator, device=sde_steps.device)
    scores = scores.masked_fill(~sde_steps, -1.0)  # non-SDE steps rank last
    chosen = scores.topk(count, dim=1).indices
    return torch.zeros_like(sde_steps).scatter_(1, chosen, True)
