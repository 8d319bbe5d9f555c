"""Flow-matching ODE samplers and the training-time noise grid.

Rectified flow: ``x_σ = (1 - σ)·x0 + σ·ε`` (σ = 1 noise), velocity ``v = ε - x0``, x0-prediction ``x̂0 = x - σ·v``.
The ODE ``dx/dσ = v(x, σ)`` is integrated from σ = 1 to σ = 0 over a caller-supplied grid.

SD3 shifted schedule: ``σ = linspace(1, 0, N + 1)``, ``σ' = shift·σ / (1 + (shift - 1)·σ)``.

Euler::

    x_{i+1} = x_i + (σ_{i+1} - σ_i)·v(x_i, σ_i)

DPM-Solver++ 2M (data prediction; α = 1 - σ, λ = log(α/σ), h_i = λ_{i+1} - λ_i)::

    D_i     = x̂0_i                                                   first step, and the last when σ_N = 0
    D_i     = (1 + 1/(2ρ_i))·x̂0_i - 1/(2ρ_i)·x̂0_{i-1},  ρ_i = h_{i-1}/h_i     otherwise
    x_{i+1} = (σ_{i+1}/σ_i)·x_i + α_{i+1}·(1 - e^{-h_i})·D_i,  e^{-h_i} = (σ_{i+1}·α_i)/(σ_i·α_{i+1})

(with σ_0 = 1, α_0 = 0 so λ_0 = -∞: the second step's correction vanishes, as in diffusers).

Training noise levels (``algorithm.nft_train_timesteps``, :func:`training_grid`), N = the sampler's steps::

    uniform   t ∈ linspace(1, 0, N + 1)[:N]            RLinf
    sampler   t ∈ σ'[:N], the shifted schedule above     NVlabs' DiffusionNFT trainer (its scheduler's timesteps)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch

Tensor = torch.Tensor
VelocityFn = Callable[[Tensor, Tensor], Tensor]
# (x [B, ...], t [B], v [B, ...]) of each velocity evaluation, in integration order (one per step for every sampler
# here: step i evaluates v at the state x_i of sigma_i)
VelocityObserver = Callable[[Tensor, Tensor, Tensor], None]


def sigma_schedule(
    num_steps: int, shift: float = 1.0, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Shifted sigma grid ``[num_steps + 1]`` from 1 to 0: ``σ' = shift·σ / (1 + (shift - 1)·σ)``."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int ≥ 1, got {num_steps!r}")
    if not shift > 0:
        raise ValueError(f"shift must be > 0, got {shift!r}")
    sigmas = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    return sigmas.to(device=device, dtype=dtype)


def _velocity(velocity_fn: VelocityFn, x: Tensor, sigma: float, dtype: torch.dtype) -> Tensor:
    """v(x, σ) as float32; the model sees x in the caller's dtype and σ as a float32 ``[B]`` tensor."""
    t = torch.full((x.shape[0],), sigma, device=x.device, dtype=torch.float32)
    v = velocity_fn(x.to(dtype), t)
    if v.shape != x.shape:
        raise ValueError(f"velocity_fn returned shape {tuple(v.shape)}, expected {tuple(x.shape)}")
    return v.float()


def euler_sampler(velocity_fn: VelocityFn, x: Tensor, sigmas: list[float], dtype: torch.dtype) -> list[Tensor]:
    """Euler steps over ``sigmas``; returns the float32 states at every sigma."""
    states = [x]
    for sigma, sigma_next in itertools.pairwise(sigmas):
        x = x + (sigma_next - sigma) * _velocity(velocity_fn, x, sigma, dtype)
        states.append(x)
    return states


def _lambda(sigma: float) -> float:
    """λ = log((1 - σ)/σ), ±inf at the ends."""
    if sigma <= 0:
        return math.inf
    if sigma >= 1:
        return -math.inf
    return math.log((1 - sigma) / sigma)


def dpm_solver_pp_2m_sampler(
    velocity_fn: VelocityFn, x: Tensor, sigmas: list[float], dtype: torch.dtype
) -> list[Tensor]:
    """DPM-Solver++ 2M in x0-prediction form (module docstring); returns the float32 states at every sigma."""
    states = [x]
    x0_prev, h_prev = None, None
    for sigma, sigma_next in itertools.pairwise(sigmas):
        x0_hat = x - sigma * _velocity(velocity_fn, x, sigma, dtype)
        h = _lambda(sigma_next) - _lambda(sigma)
        last_to_zero = sigma_next <= 0
        if x0_prev is None or last_to_zero or not math.isfinite(h_prev):
            d = x0_hat
        else:
            half_inv_rho = h / (2 * h_prev)  # 1/(2ρ), ρ = h_{i-1}/h_i
            d = (1 + half_inv_rho) * x0_hat - half_inv_rho * x0_prev
        if last_to_zero:
            x = d
        else:
            alpha, alpha_next = 1 - sigma, 1 - sigma_next
            exp_neg_h = (sigma_next * alpha) / (sigma * alpha_next)
            x = (sigma_next / sigma) * x + alpha_next * (1 - exp_neg_h) * d
        x0_prev, h_prev = x0_hat, h
        states.append(x)
    return states


SAMPLERS: dict[str, Callable[[VelocityFn, Tensor, list[float], torch.dtype], list[Tensor]]] = {
    "euler": euler_sampler,
    "dpm2": dpm_solver_pp_2m_sampler,
    "dpm_solver_pp_2m": dpm_solver_pp_2m_sampler,
}


def sample_flow(
    velocity_fn: VelocityFn,
    noise: Tensor,
    sigmas: Tensor,
    sampler: str = "euler",
    return_trajectory: bool = False,
    observer: VelocityObserver | None = None,
) -> Tensor | tuple[Tensor, list[Tensor]]:
    """Integrate the flow ODE from ``noise`` (σ = sigmas[0]) to σ = sigmas[-1] (normally 0).

    Args:
        velocity_fn: ``(x [B, ...], t [B] float32) -> v [B, ...]``, t the current sigma (1 = noise);
            x is passed in ``noise``'s dtype, the returned v may be any float dtype.
        noise: ``[B, ...]`` starting state.
        sigmas: ``[N + 1]`` non-increasing grid, e.g. ``sigma_schedule(N, shift)``.
        sampler: a name in ``SAMPLERS`` (``"euler"``, ``"dpm2"``).
        return_trajectory: also return the N + 1 states (first = noise).
        observer: ``(x, t, v) -> None``, shown each velocity evaluation in step order: the state ``x`` ``[B, ...]``
            (noise's dtype) at sigma ``t`` ``[B]`` (float32) and the ``v`` velocity_fn returned for it.

    Returns:
        x0 ``[B, ...]`` in ``noise``'s dtype, or ``(x0, trajectory)``. The update math runs in float32.
    """
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}; valid: {sorted(SAMPLERS)}")
    if sigmas.dim() != 1 or sigmas.numel() < 2:
        raise ValueError(f"sigmas must be 1-D with at least 2 entries, got shape {tuple(sigmas.shape)}")
    grid = sigmas.detach().double().cpu().tolist()  # Python floats: no device sync inside the loop
    if any(b > a for a, b in itertools.pairwise(grid)) or grid[0] > 1 or grid[-1] < 0:
        raise ValueError(f"sigmas must be non-increasing within [0, 1], got {grid}")
    if observer is not None:
        velocity_fn = _observed(velocity_fn, observer)
    states = SAMPLERS[sampler](velocity_fn, noise.float(), grid, noise.dtype)
    x0 = states[-1].to(noise.dtype)
    if return_trajectory:
        return x0, [s.to(noise.dtype) for s in states]
    return x0


def _observed(velocity_fn: VelocityFn, observer: VelocityObserver) -> VelocityFn:
    """``velocity_fn`` that also shows each ``(x, t, v)`` to ``observer``."""

    def observed(x: Tensor, t: Tensor) -> Tensor:
        v = velocity_fn(x, t)
        observer(x, t, v)
        return v

    return observed


def training_timesteps(
    num_steps: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Training noise grid ``linspace(1, 0, num_steps + 1)`` (RLinf's ``nft`` grid)."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int ≥ 1, got {num_steps!r}")
    return torch.linspace(1.0, 0.0, num_steps + 1, device=device, dtype=dtype)


#: algorithm.nft_train_timesteps: where a training t is drawn from (:func:`training_grid`)
TRAIN_TIMESTEPS = ("uniform", "sampler")


def training_grid(kind: str, sampler_sigmas: Tensor) -> Tensor:
    """The ``[N]`` noise levels a training t is drawn from (``algorithm.nft_train_timesteps``), N = the sampler's
    steps, ``sampler_sigmas`` its ``[N + 1]`` grid.

    ``uniform``: ``linspace(1, 0, N + 1)[:N]`` whatever the sampler's schedule (RLinf); ``sampler``: the sampler's
    own sigmas ``σ[:N]``, the noise levels at which the rollout evaluated the policy (NVlabs' DiffusionNFT trainer:
    its scheduler's timesteps / 1000). On an unshifted grid the two agree (up to one float32 rounding for some N).
    """
    if kind not in TRAIN_TIMESTEPS:
        raise ValueError(f"unknown algorithm.nft_train_timesteps {kind!r}; valid: {sorted(TRAIN_TIMESTEPS)}")
    num_steps = sampler_sigmas.numel() - 1
    grid = training_timesteps(num_steps) if kind == "uniform" else sampler_sigmas.float().cpu()
    return grid[:num_steps]


def distinct_levels(num_levels: int, draws: int, generator: torch.Generator) -> Tensor:
    """Grid indices of a sample's ``draws`` training passes, distinct while ``draws ≤ num_levels``.

    The first ``draws`` entries of a chain of independent permutations of ``0..num_levels-1`` drawn from
    ``generator`` (NVlabs' DiffusionNFT trainer: a per-sample ``randperm`` of its timesteps), so each level is drawn
    with probability ``draws/num_levels`` and beyond ``num_levels`` draws every level appears ``⌊draws/N⌋`` or
    ``⌈draws/N⌉`` times. Seed ``generator`` by the sample, not its draw: every draw reads the same chain.

    Returns:
        int64 ``[draws]`` on the CPU.
    """
    if num_levels < 1 or draws < 1:
        raise ValueError(f"need num_levels ≥ 1 and draws ≥ 1, got {num_levels} and {draws}")
    chains = -(-draws // num_levels)  # ceil
    return torch.cat([torch.randperm(num_levels, generator=generator) for _ in range(chains)])[:draws]


def sample_xt(
    x0: Tensor, grid: int | Tensor, generator: torch.Generator | list[torch.Generator] | None = None,
    levels: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Draw a training noise level per sample and noise the clean latents.

    ``k ~ U{0..N-1}`` (or the given ``levels``), ``t = grid[k]``, fresh ``ε ~ N(0, I)``, ``x_t = (1 - t)·x0 + t·ε``.

    Args:
        x0: ``[B, ...]`` clean latents.
        grid: the ``[N]`` noise levels to draw from (:func:`training_grid`), or the sampler's step count N for
            RLinf's grid ``linspace(1, 0, N + 1)[:N]``.
        generator: optional ``torch.Generator`` on x0's device for replayable draws, or a list of ``B``
            generators, one per sample (sample i draws its k, then its ε, from ``generator[i]``), so that a
            sample's noise does not depend on which other samples share its batch.
        levels: optional int64 ``[B]`` grid indices k chosen by the caller (:func:`distinct_levels`); then the
            generators draw only ε.

    Returns:
        ``(x_t [B, ...] in x0's dtype, t [B] float32, noise [B, ...] in x0's dtype)``.
    """
    if isinstance(grid, int):
        grid = training_timesteps(grid)[:grid]
    if grid.dim() != 1 or grid.numel() < 1:
        raise ValueError(f"grid must be 1-D with at least one noise level, got shape {tuple(grid.shape)}")
    grid, num_levels = grid.to(device=x0.device, dtype=torch.float32), grid.numel()
    if levels is not None and (tuple(levels.shape) != (x0.shape[0],) or levels.min() < 0 or levels.max() >= num_levels):
        raise ValueError(f"levels must be [B] = ({x0.shape[0]},) grid indices in [0, {num_levels}), got {levels}")
    if isinstance(generator, list):
        if len(generator) != x0.shape[0]:
            raise ValueError(f"{len(generator)} generators for a batch of {x0.shape[0]} samples")
        if levels is None:
            draws = [_draw_k_eps(x0[:1], num_levels, g) for g in generator]
            k, noise = torch.cat([d[0] for d in draws]), torch.cat([d[1] for d in draws])
        else:
            k, noise = levels, torch.cat([_draw_eps(x0[:1], g) for g in generator])
    elif levels is None:
        k, noise = _draw_k_eps(x0, num_levels, generator)
    else:
        k, noise = levels, _draw_eps(x0, generator)
    t = grid[k.to(grid.device)]
    t_b = t.reshape(-1, *([1] * (x0.dim() - 1)))
    x_t = (1 - t_b) * x0.float() + t_b * noise
    return x_t.to(x0.dtype), t, noise.to(x0.dtype)


def _draw_k_eps(x0: Tensor, num_steps: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Grid indices ``[B]`` then float32 noise shaped like ``x0``, in that order from ``generator``."""
    k = torch.randint(0, num_steps, (x0.shape[0],), generator=generator, device=x0.device)
    return k, _draw_eps(x0, generator)


def _draw_eps(x0: Tensor, generator: torch.Generator | None) -> Tensor:
    """float32 noise shaped like ``x0`` from ``generator``."""
    return torch.randn(x0.shape, generator=generator, device=x0.device, dtype=torch.float32)
