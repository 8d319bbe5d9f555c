"""DiffusionNFT policy loss (arXiv 2509.16117), rectified-flow convention.

Conventions: ``x_t = (1 - t)·x0 + t·ε`` with t = 1 pure noise, and the model predicts the velocity ``v = ε - x0``,
so an x0-prediction is ``x̂0 = x_t - t·v``. ``v_old`` comes from the EMA ("old") adapter without gradient and
``v_θ`` from the trained adapter. With β = ``beta`` and c = ``adv_clip_max``::

    Δv  = v_θ - v_old ;   v± = v_old ± β·Δv
    x̂0± = x_t - t·v±
    w±  = 1 / clamp_min(mean|x̂0± - x0|, 1e-5)          (no gradient; weight_mode "adaptive", else 1)
    E±  = mean((x̂0± - x0)²)·w±                         per sample, or per sample and latent frame
    a   = m(clamp(A, -c, c))                             m: adv_mode (ADV_MODES), identity for "all"
    r   = clamp((a + c) / (2c), 0, 1)                    r ∈ [0, 1]
    L   = mean((r·E+ + (1 - r)·E-)·c/β)

Brake (``restore_frac``): with w± held fixed, per element ``(r·(x̂0+ - x0)²·w+ + (1 - r)·(x̂0- - x0)²·w-)·c/β`` is
``const + 2c·k·P·d·Δv + c·β·k²·W·Δv²`` with ``k = -t``, ``P = r·w+ - (1 - r)·w-``, ``W = r·w+ + (1 - r)·w-``: a
first-order learning signal linear in Δv and a restoring term that pulls v_θ back to v_old. Their gradients in Δv
are ``g_learn = 2c·k·P·d`` and ``g_restore = 2c·β·k²·W·Δv``, and over the batch's elements::

    restore_frac = ‖g_restore‖ / (‖g_learn‖ + ‖g_restore‖)      ∈ [0, 1], 0 at Δv = 0 (0 where both vanish)

so 0.5 means the brake is as strong as the push (of the loss without trust region and anchor).

Trust region (``clip_ratio`` = ρ): ``s = min(1, ρ·‖v_old‖/‖Δv‖)`` per sample (and latent frame); where s < 1 the
clipped ``Δv_c = s·Δv`` is detached, the clipped energies use the same w±, and the per-element loss is the
pessimistic ``max(L, L_c)``. Anchor (``kl_coef`` = k): ``+ k·mean((v_θ - v_base)²)``, v_base = adapters off.

Computed as ``x̂0± - x0 = d ∓ t·β·Δv`` with the constant ``d = x_t - t·v_old - x0``: the same values with a third
of the elementwise work on the gradient path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Tensor = torch.Tensor

WEIGHT_EPS = 1e-5  # clamp_min of the adaptive weight's denominator (official DiffusionNFT value)
VIDEO_FRAME_DIM = 2  # latent frame axis of video latents [B, C, F, H, W]
METRIC_KEYS = ("nft_loss", "delta_v_norm", "clip_frac", "clip_loss_frac", "E_pos_mean", "E_neg_mean", "kl",
               "restore_frac")

# algorithm.nft_adv_mode: the map m of the clipped advantage a ∈ [-c, c] before r (NVlabs' trainer's adv_mode)
ADV_MODES: dict[str, Callable[[Tensor, float], Tensor]] = {
    "all": lambda a, c: a,  # a itself
    "positive_only": lambda a, c: a.clamp(0, c),  # negative advantages count as 0 (r = 1/2): learn from wins only
    "negative_only": lambda a, c: a.clamp(-c, 0),  # positive advantages count as 0: learn from losses only
    "one_only": lambda a, c: (a > 0).to(a.dtype),  # 1 for a win, 0 otherwise: r = 1/2 + 1/(2c) or 1/2
    "binary": lambda a, c: a.sign(),  # ±1 (0 at a = 0): r = 1/2 ± 1/(2c)
}


def nft_velocities(v_theta: Tensor, v_old: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """Implicit positive and negative policies ``v± = v_old ± β·(v_θ - v_old)``; they average to ``v_old``.

    Args:
        v_theta: ``[B, ...]`` current velocity (carries the gradient).
        v_old: ``[B, ...]`` old-policy velocity, treated as a constant.
        beta: β > 0, the step between the old and the implicit policies.

    Returns:
        ``(v_pos, v_neg)``, each ``[B, ...]``.
    """
    delta_v = v_theta - v_old
    return v_old + beta * delta_v, v_old - beta * delta_v


def _x0_residual(x_t: Tensor, x0: Tensor, t: Tensor, v_old: Tensor) -> tuple[Tensor, Tensor]:
    """x0 target space: x̂0± - x0 = (x_t - t·v_old - x0) - t·(±β·Δv) = d + k·(±β·Δv) with d = x̂0_old - x0, k = -t."""
    return x_t - t * v_old - x0, -t


# target space -> (x_t, x0, t [B, 1, ...], v_old) -> (d, k) such that the residual of v_old + u is d + k·u
TARGET_SPACES: dict[str, Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]] = {"x0": _x0_residual}


def _adaptive_weight(err: Tensor, reduce: Callable[[Tensor], Tensor]) -> Tensor:
    """w = 1 / clamp_min(mean|err|, 1e-5) over the reduction axes, without gradient."""
    with torch.no_grad():
        return 1.0 / reduce(err.detach().abs()).clamp_min(WEIGHT_EPS)


def _constant_weight(err: Tensor, reduce: Callable[[Tensor], Tensor]) -> Tensor:
    """w = 1 (a scalar that broadcasts against the per-sample energies)."""
    return err.new_ones(())


WEIGHT_MODES: dict[str, Callable[[Tensor, Callable[[Tensor], Tensor]], Tensor]] = {
    "adaptive": _adaptive_weight,
    "constant": _constant_weight,
}


def _lookup(registry: dict, name: str, what: str):
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; valid: {sorted(registry)}")
    return registry[name]


def _check_inputs(v_theta, v_old, x_t, x0, t, adv, v_base, beta, adv_clip_max, clip_ratio, kl_coef) -> None:
    shape = tuple(x0.shape)
    for name, tensor in (("v_theta", v_theta), ("v_old", v_old), ("x_t", x_t)):
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected x0's shape {shape}")
    if x0.dim() < 2:
        raise ValueError(f"latents must be [B, ...] with at least 2 dims, got x0 of shape {shape}")
    batch = shape[0]
    if tuple(t.shape) != (batch,):
        raise ValueError(f"t has shape {tuple(t.shape)}, expected [B] = ({batch},)")
    if adv.dim() == 2:
        if x0.dim() != 5 or adv.shape[0] != batch or adv.shape[1] != shape[VIDEO_FRAME_DIM]:
            raise ValueError(
                f"per-frame adv of shape {tuple(adv.shape)} needs video latents [B, C, F, H, W] with "
                f"adv = [B, F]; got latents {shape}"
            )
    elif tuple(adv.shape) != (batch,):
        raise ValueError(f"adv has shape {tuple(adv.shape)}, expected [B] = ({batch},) or [B, F] for video")
    if v_base is not None and tuple(v_base.shape) != shape:
        raise ValueError(f"v_base has shape {tuple(v_base.shape)}, expected x0's shape {shape}")
    if kl_coef != 0.0 and v_base is None:
        raise ValueError(f"kl_coef={kl_coef} needs v_base (the velocity with adapters off); got v_base=None")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not adv_clip_max > 0:
        raise ValueError(f"adv_clip_max must be > 0, got {adv_clip_max}")
    if clip_ratio is not None and not clip_ratio > 0:
        raise ValueError(f"clip_ratio must be None (off) or > 0, got {clip_ratio}")


def _reducer(x0: Tensor, per_frame: bool) -> Callable[[Tensor], Tensor]:
    """Mean over every axis but the batch (and, per frame, the latent frame axis): ``[B, ...] -> [B]`` or [B, F]."""
    dims = tuple(d for d in range(1, x0.dim()) if not (per_frame and d == VIDEO_FRAME_DIM))
    return lambda x: x.mean(dim=dims)


def _expand(per_elem: Tensor, like: Tensor, per_frame: bool) -> Tensor:
    """Broadcast a ``[B]`` (or ``[B, F]``) tensor against ``[B, ...]`` latents."""
    if per_frame:
        return per_elem.reshape(per_elem.shape[0], 1, per_elem.shape[1], *([1] * (like.dim() - 3)))
    return per_elem.reshape(-1, *([1] * (like.dim() - 1)))


def reward_weight(adv: Tensor, adv_clip_max: float, adv_mode: str = "all") -> Tensor:
    """``r = clamp((m(clamp(A, -c, c)) + c)/(2c), 0, 1)`` (module docstring), float32, without gradient; ``adv``
    ``[B]`` or ``[B, F]``, ``m`` = ``ADV_MODES[adv_mode]``."""
    mode = _lookup(ADV_MODES, adv_mode, "adv_mode")
    c = float(adv_clip_max)
    a = mode(adv.detach().float().clamp(-c, c), c)
    return ((a + c) / (2 * c)).clamp(0, 1)


def restore_fraction(d: Tensor, k: Tensor, delta_v: Tensor, r: Tensor, w_pos: Tensor, w_neg: Tensor, beta: float,
                     expand: Callable[[Tensor], Tensor]) -> Tensor:
    """``‖g_restore‖ / (‖g_learn‖ + ‖g_restore‖)`` (module docstring), a float32 scalar without gradient.

    Args:
        d: ``[B, ...]`` x̂0_old - x0. k: ``[B, 1, ...]`` ∂x̂0/∂v = -t. delta_v: ``[B, ...]`` v_θ - v_old.
        r, w_pos, w_neg: ``[B]`` (or ``[B, F]``; a weight may be a scalar) reward weight and energy weights w±.
        expand: broadcasts an r-shaped tensor against the latents.
    """
    with torch.no_grad():
        p, w = expand(r * w_pos - (1 - r) * w_neg), expand(r * w_pos + (1 - r) * w_neg)
        learn = (k * p * d).square().sum().sqrt()  # the common factor 2c drops out of the fraction
        restore = (beta * k.square() * w * delta_v.detach()).square().sum().sqrt()
        return restore / (learn + restore).clamp_min(torch.finfo(restore.dtype).tiny)


def _trust_region_scale(
    v_old: Tensor, delta_v: Tensor, clip_ratio: float, reduce: Callable[[Tensor], Tensor]
) -> Tensor:
    """s = min(1, ρ·‖v_old‖/‖Δv‖) per sample (and frame), without gradient; s = 1 where Δv = 0.

    Both norms are taken as RMS (mean instead of sum of squares): the ratio is the same.
    """
    with torch.no_grad():
        norm_old = reduce(v_old.square()).sqrt()
        norm_dv = reduce(delta_v.detach().square()).sqrt()
        bound = clip_ratio * norm_old
        binds = norm_dv > bound
        return torch.where(binds, bound / norm_dv.clamp_min(torch.finfo(norm_dv.dtype).tiny), torch.ones_like(bound))


def nft_loss(
    v_theta: Tensor,
    v_old: Tensor,
    x_t: Tensor,
    x0: Tensor,
    t: Tensor,
    adv: Tensor,
    *,
    beta: float,
    adv_clip_max: float = 5.0,
    weight_mode: str = "adaptive",
    target_space: str = "x0",
    clip_ratio: float | None = None,
    v_base: Tensor | None = None,
    kl_coef: float = 0.0,
    adv_mode: str = "all",
) -> tuple[Tensor, dict[str, float]]:
    """DiffusionNFT loss (equations in the module docstring).

    Args:
        v_theta: ``[B, ...]`` velocity of the trained policy (gradient flows through it only).
            Image latents ``[B, C, H, W]``, video latents ``[B, C, F, H, W]``.
        v_old: ``[B, ...]`` velocity of the old (EMA) policy; detached here.
        x_t: ``[B, ...]`` noised latents ``(1 - t)·x0 + t·ε``.
        x0: ``[B, ...]`` clean rollout latents.
        t: ``[B]`` noise level in [0, 1], t = 1 noise.
        adv: ``[B]`` advantages, or ``[B, F]`` per latent frame of 5-D video latents (then the energies and the
            trust region are per sample and latent frame).
        beta: β > 0 (``nft_beta``).
        adv_clip_max: c > 0; advantages are clipped to [-c, c] and mapped to r ∈ [0, 1].
        weight_mode: ``"adaptive"`` (w = 1/mean|x̂0 - x0|, no grad) or ``"constant"`` (w = 1).
        target_space: ``"x0"`` (the only one for now).
        clip_ratio: ρ > 0 enables the trust region on ‖Δv‖; None disables it.
        v_base: ``[B, ...]`` velocity with adapters off, for the anchor term and the ``kl`` metric.
        kl_coef: k ≥ 0, weight of ``mean((v_θ - v_base)²)``.
        adv_mode: the map of the clipped advantage before r (``ADV_MODES``): ``"all"`` (identity),
            ``"positive_only"``, ``"negative_only"``, ``"one_only"``, ``"binary"``.

    Returns:
        ``(loss, metrics)``: a scalar float32 loss with gradient (NFT loss + anchor), and floats ``nft_loss`` (the NFT
        part), ``delta_v_norm`` (mean over samples/frames of the RMS of Δv, i.e. ‖Δv‖/√n), ``clip_frac`` (share of
        samples/frames with s < 1), ``clip_loss_frac`` (share where the clipped loss was larger and taken),
        ``E_pos_mean``, ``E_neg_mean``, ``kl`` (``mean((v_θ - v_base)²)``, 0 without v_base), ``restore_frac``
        (the brake's share of the gradient, module docstring).

    Computation runs in float32 (inputs in lower precision are upcast).
    """
    weight_fn = _lookup(WEIGHT_MODES, weight_mode, "weight_mode")
    residual_fn = _lookup(TARGET_SPACES, target_space, "target_space")
    _check_inputs(v_theta, v_old, x_t, x0, t, adv, v_base, beta, adv_clip_max, clip_ratio, kl_coef)

    v_theta, x_t, x0 = v_theta.float(), x_t.float(), x0.float()
    v_old = v_old.detach().float()
    per_frame = adv.dim() == 2
    reduce = _reducer(x0, per_frame)
    t_b = t.detach().float().reshape(-1, *([1] * (x0.dim() - 1)))
    c = float(adv_clip_max)
    r = reward_weight(adv, c, adv_mode)

    d, k = residual_fn(x_t, x0, t_b, v_old)  # constants: x̂0_old - x0 and ∂x̂0/∂v = -t
    k_beta = k * beta

    def errors(delta_v: Tensor) -> tuple[Tensor, Tensor]:
        """x̂0± - x0 for v± = v_old ± β·Δv, i.e. d ± k·β·Δv."""
        step = k_beta * delta_v
        return d + step, d - step

    delta_v = v_theta - v_old
    err_pos, err_neg = errors(delta_v)
    w_pos, w_neg = weight_fn(err_pos, reduce), weight_fn(err_neg, reduce)
    e_pos, e_neg = reduce(err_pos.square()) * w_pos, reduce(err_neg.square()) * w_neg
    per_elem = (r * e_pos + (1 - r) * e_neg) * (c / beta)

    zero = per_elem.new_zeros(())
    binds = take_clipped = zero
    if clip_ratio is not None:
        s = _trust_region_scale(v_old, delta_v, clip_ratio, reduce)
        binds = s < 1
        delta_v_c = torch.where(_expand(binds, x0, per_frame), (_expand(s, x0, per_frame) * delta_v).detach(), delta_v)
        err_pos_c, err_neg_c = errors(delta_v_c)
        e_pos_c, e_neg_c = reduce(err_pos_c.square()) * w_pos, reduce(err_neg_c.square()) * w_neg
        per_elem_c = (r * e_pos_c + (1 - r) * e_neg_c) * (c / beta)
        take_clipped = per_elem_c > per_elem  # ties keep the unclipped branch and its gradient
        per_elem = torch.where(take_clipped, per_elem_c, per_elem)

    policy_loss = per_elem.mean()
    loss, kl = policy_loss, zero
    if v_base is not None:
        kl = (v_theta - v_base.detach().float()).square().mean()
        if kl_coef != 0.0:
            loss = loss + kl_coef * kl

    with torch.no_grad():  # one device sync for all metrics
        values = torch.stack(
            [
                policy_loss.detach(),
                reduce(delta_v.detach().square()).sqrt().mean(),
                binds.float().mean(),
                take_clipped.float().mean(),
                e_pos.detach().mean(),
                e_neg.detach().mean(),
                kl.detach(),
                restore_fraction(d, k, delta_v, r, w_pos, w_neg, beta, lambda x: _expand(x, x0, per_frame)),
            ]
        ).tolist()
    metrics = dict(zip(METRIC_KEYS, values))
    return loss, metrics
