"""Advantage Weighted Matching (AWM, arXiv 2509.25050), rectified-flow convention.

AWM trains on the pretraining objective itself: the flow-matching error of the policy's velocity on its own clean
samples, each sample's error weighted by its advantage, so that high-reward samples are fitted and low-reward ones
pushed away. Conventions as in :mod:`rlrunner.algorithms.nft_loss`: ``x_t = (1 - t)·x0 + t·ε`` with t = 1 pure noise,
the model predicts ``v = ε - x0``. With c = ``adv_clip_max``::

    ℓ   = mean((v_θ(x_t, t) - (ε - x0))²)            per sample (per sample and latent frame for [B, F] advantages)
    Â   = clamp(A, -c, c) / c                         Â ∈ [-1, 1]
    L   = mean(Â · w(ℓ, t))  +  k_ref·mean((v_θ - v_ref)²)  +  k_ema·mean((v_θ - v_ema)²)

The time weighting ``w(ℓ, t)`` (``weighting``; the official names in brackets), δ = 1e-10, p = ``ghuber_power``::

    none    w = ℓ                                    [Uniform]
    t       w = t·ℓ                                  [t]
    t2      w = t²·ℓ                                 [t**2]
    huber   w = t·(√(ℓ + δ) - √δ)                    [huber]
    ghuber  w = t·((ℓ + δ)^p - δ^p) / p              [ghuber; p = 0.25 in every released config]

Every w grows with ℓ (for t > 0), so descending L lowers ℓ where Â > 0 (v_θ moves toward ε - x0) and raises it
where Â < 0; the robust weightings (huber, ghuber) shrink the pull of samples the model fits badly.

Faithfulness to the official trainer (scxue/advantage_weighted_matching, ``scripts/train_sd3_awm.py``) and to
Flow-Factory's ``trainers/awm.py``:

- The official code writes the policy term as PPO's surrogate ``-Â·exp(log p - log p_old)`` with ``log p = -w``
  and the old log-prob taken from the same on-policy forward, detached, so the ratio is exactly 1 (its
  ``clip_range`` "currently not work (on policy)"): the gradient is that of ``mean(Â·w)``, which is what we
  compute (the value differs: theirs is ``-mean(Â)``). Hence no ratio and no clipping here; rollouts must come
  from the trained policy (``objectives/awm.py`` samples with the ``default`` adapter) and, to stay on-policy,
  one optimizer step per rollout (``actor.global_batch_size`` = samples per step), as the official recipes do.
- Advantages are clipped to ±``adv_clip_max`` and rescaled to [-1, 1] (official ``adv_clip_max`` 5 with
  ``advantage_max`` 1; Flow-Factory clips without rescaling, a constant factor on the policy term).
- ``v_ref`` (adapters off, official ``beta``, 0.001-0.003) and ``v_ema`` (official ``ema_beta`` = 1, an EMA of
  the trained weights with decay ``min(0.3, 0.001·step)``) enter as plain velocity-space squared distances (their
  ``kl_weight: Uniform``); the official ``ELBO`` KL weighting needs the SDE's std and is not offered.
- Unlike NFT's loss, ``mean(Â·w)`` has no term that pulls v_θ back to the sampling policy: negative samples are
  pushed away without bound. Flow-Factory warns that AWM collapses without an anchor or clipping; the anchors and
  a small learning rate (official 3e-4) are what holds it.
- The official code computes ℓ in float64; we use float32 (velocities in lower precision are upcast).

The training noise levels (``awm_band_index``) follow the official ``time_type: discrete_wo_init``: the rollout
sampler's own sigmas σ_k, with k drawn from the band 1 ≤ k < ⌊N·fraction⌋ (never the pure-noise σ_0), stratified
over the timesteps drawn per sample.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tensor = torch.Tensor

HUBER_DELTA = 1e-10  # δ under the root/power of the robust weightings: a finite gradient at ℓ = 0 (official value)
VIDEO_FRAME_DIM = 2  # latent frame axis of video latents [B, C, F, H, W]
METRIC_KEYS = ("awm_loss", "fm_loss", "kl", "ema_kl")


def _none(ell: Tensor, t: Tensor, power: float) -> Tensor:
    return ell


def _t(ell: Tensor, t: Tensor, power: float) -> Tensor:
    return t * ell


def _t2(ell: Tensor, t: Tensor, power: float) -> Tensor:
    return t.square() * ell


def _huber(ell: Tensor, t: Tensor, power: float) -> Tensor:
    return t * ((ell + HUBER_DELTA).sqrt() - HUBER_DELTA**0.5)


def _ghuber(ell: Tensor, t: Tensor, power: float) -> Tensor:
    return t * ((ell + HUBER_DELTA).pow(power) - HUBER_DELTA**power) / power


# weighting -> w(ℓ [B] or [B, F], t broadcast to ℓ, ghuber_power) (module docstring)
WEIGHTINGS: dict[str, Callable[[Tensor, Tensor, float], Tensor]] = {
    "none": _none,
    "t": _t,
    "t2": _t2,
    "huber": _huber,
    "ghuber": _ghuber,
}


def awm_band_index(u: Tensor, num_steps: int, fraction: float, draw: int, draws: int) -> Tensor:
    """Grid index k of each sample's ``draw``-th training timestep (official ``discrete_wo_init``).

    The band 1 ≤ k < K = ⌊num_steps·fraction⌋ of the sampler's N = ``num_steps`` steps is cut into ``draws``
    strata at ``b = linspace(1, K, draws + 1)`` (truncated to integers); draw d takes
    ``k = b_d + ⌊u·(b_{d+1} - b_d)⌋``, i.e. uniform within stratum d (its lower bound when the stratum is empty,
    as when K = 1). So the draws of one sample spread over the band instead of clustering.

    Args:
        u: ``[B]`` uniform numbers in [0, 1), one per sample.
        num_steps: N ≥ 2, the rollout sampler's step count (its grid has N + 1 sigmas, σ_0 = 1).
        fraction: in (0, 1] with ⌊N·fraction⌋ ≥ 1; the share of the N steps (from the noisy end) trained on.
        draw: 0 ≤ draw < draws.
        draws: timesteps drawn per sample.

    Returns:
        int64 ``[B]`` indices into the sampler's sigma grid, in [1, N - 1].
    """
    top = int(num_steps * fraction)
    if num_steps < 2 or top < 1:
        raise ValueError(f"the AWM band needs num_steps >= 2 and int(num_steps * fraction) >= 1; got "
                         f"num_steps={num_steps}, fraction={fraction}")
    if not 0 <= draw < draws:
        raise ValueError(f"draw={draw} is outside [0, draws={draws})")
    bounds = torch.linspace(1, top, draws + 1).long()
    low, high = bounds[draw], bounds[draw + 1]
    return low + (u * (high - low)).long()


def _check_inputs(v_theta, x0, noise, t, adv, v_ref, kl_coef, v_ema, ema_kl_coef, adv_clip_max, power) -> None:
    shape = tuple(x0.shape)
    if x0.dim() < 2:
        raise ValueError(f"latents must be [B, ...] with at least 2 dims, got x0 of shape {shape}")
    for name, tensor in (("v_theta", v_theta), ("noise", noise), ("v_ref", v_ref), ("v_ema", v_ema)):
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected x0's shape {shape}")
    batch = shape[0]
    if tuple(t.shape) != (batch,):
        raise ValueError(f"t has shape {tuple(t.shape)}, expected [B] = ({batch},)")
    if adv.dim() == 2:
        if x0.dim() != 5 or tuple(adv.shape) != (batch, shape[VIDEO_FRAME_DIM]):
            raise ValueError(f"per-frame adv of shape {tuple(adv.shape)} needs video latents [B, C, F, H, W] with "
                             f"adv = [B, F]; got latents {shape}")
    elif tuple(adv.shape) != (batch,):
        raise ValueError(f"adv has shape {tuple(adv.shape)}, expected [B] = ({batch},) or [B, F] for video")
    for coef_name, coef, ref_name, ref in (("kl_coef", kl_coef, "v_ref", v_ref),
                                           ("ema_kl_coef", ema_kl_coef, "v_ema", v_ema)):
        if not coef >= 0:
            raise ValueError(f"{coef_name} must be >= 0, got {coef}")
        if coef > 0 and ref is None:
            raise ValueError(f"{coef_name}={coef} needs {ref_name}; got {ref_name}=None")
    if not adv_clip_max > 0:
        raise ValueError(f"adv_clip_max must be > 0, got {adv_clip_max}")
    if not power > 0:
        raise ValueError(f"ghuber_power must be > 0, got {power}")


def awm_loss(
    v_theta: Tensor,
    x0: Tensor,
    noise: Tensor,
    t: Tensor,
    adv: Tensor,
    *,
    weighting: str = "none",
    ghuber_power: float = 0.25,
    adv_clip_max: float = 5.0,
    v_ref: Tensor | None = None,
    kl_coef: float = 0.0,
    v_ema: Tensor | None = None,
    ema_kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """AWM loss (equations in the module docstring).

    Args:
        v_theta: ``[B, ...]`` velocity of the trained policy at ``x_t = (1 - t)·x0 + t·noise`` (carries the
            gradient). Image latents ``[B, C, H, W]``, video latents ``[B, C, F, H, W]``.
        x0: ``[B, ...]`` clean rollout latents.
        noise: ``[B, ...]`` the ε that made x_t; the flow-matching target is ``noise - x0``.
        t: ``[B]`` noise level in (0, 1], t = 1 noise.
        adv: ``[B]`` advantages, or ``[B, F]`` per latent frame of 5-D video latents (then ℓ, w and Â are per
            sample and latent frame).
        weighting: ``none`` | ``t`` | ``t2`` | ``huber`` | ``ghuber`` (:data:`WEIGHTINGS`).
        ghuber_power: p > 0 of ``ghuber``.
        adv_clip_max: c > 0; advantages are clipped to [-c, c] and divided by c.
        v_ref: ``[B, ...]`` velocity with adapters off, for the KL anchor and the ``kl`` metric.
        kl_coef: k_ref ≥ 0, weight of ``mean((v_θ - v_ref)²)``.
        v_ema: ``[B, ...]`` velocity of the EMA adapter, for the EMA anchor and the ``ema_kl`` metric.
        ema_kl_coef: k_ema ≥ 0, weight of ``mean((v_θ - v_ema)²)``.

    Returns:
        ``(loss, metrics)``: a scalar float32 loss with gradient, and floats ``awm_loss`` (``mean(Â·w)``, the
        policy term), ``fm_loss`` (``mean(ℓ)``, the plain flow-matching error), ``kl`` (``mean((v_θ - v_ref)²)``,
        0 without v_ref) and ``ema_kl`` (``mean((v_θ - v_ema)²)``, 0 without v_ema).
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"unknown weighting {weighting!r}; valid: {sorted(WEIGHTINGS)}")
    _check_inputs(v_theta, x0, noise, t, adv, v_ref, kl_coef, v_ema, ema_kl_coef, adv_clip_max, ghuber_power)

    v_theta = v_theta.float()
    per_frame = adv.dim() == 2
    dims = tuple(d for d in range(1, x0.dim()) if not (per_frame and d == VIDEO_FRAME_DIM))
    ell = (v_theta - (noise.float() - x0.float())).square().mean(dim=dims)  # [B] or [B, F]
    t_ell = t.detach().float().reshape(-1, *([1] * (ell.dim() - 1)))
    c = float(adv_clip_max)
    adv_hat = adv.detach().float().clamp(-c, c) / c
    policy_loss = (adv_hat * WEIGHTINGS[weighting](ell, t_ell, float(ghuber_power))).mean()

    loss = policy_loss
    zero = policy_loss.new_zeros(())
    anchors = []
    for ref, coef in ((v_ref, kl_coef), (v_ema, ema_kl_coef)):
        distance = zero if ref is None else (v_theta - ref.detach().float()).square().mean()
        if coef > 0:
            loss = loss + coef * distance
        anchors.append(distance.detach())

    with torch.no_grad():  # one device sync for all metrics
        values = torch.stack([policy_loss.detach(), ell.detach().mean(), *anchors]).tolist()
    return loss, dict(zip(METRIC_KEYS, values))
