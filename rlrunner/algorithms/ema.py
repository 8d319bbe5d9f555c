"""EMA ("old" policy) schedules and the in-place update.

RLinf's tau convention (``algorithm.nft_tau``), applied after each optimizer step::

    ema ← (1 - tau)·ema + tau·θ            tau ≥ 1 copies θ
    tau = scalar, or [start, end, s0, s1]: start for step ≤ s0, end for step ≥ s1, linear in between

The official DiffusionNFT decay convention ``ema ← η·ema + (1 - η)·θ`` is the same update with ``tau = 1 - η``::

    copy                       η = 0
    linear_to_0_5              η = min(0.001·step, 0.5)
    delayed_linear_to_0_999    η = 0 for step < 75, then min(0.0075·(step - 75), 0.999)

where ``step`` counts optimizer steps, as the official trainer's ``global_step`` does: it updates the old policy
once per epoch (our global step), after that epoch's optimizer steps, with η at the optimizer steps taken so far.
The actor passes its count of optimizer steps taken (skipped non-finite steps excluded; restored on resume), so a
recipe with S optimizer steps per global step has η = decay_at(kind, S·k) after its k-th global step.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

import torch

Tensor = torch.Tensor

#: the recipe keys of the EMA's schedule: RLinf's names, kept, though every algorithm's EMA reads them (NFT's old
#: policy, AWM's anchor), not NFT's alone
EMA_KEYS = ("nft_tau", "nft_decay_type")

# kind -> (flat steps, rate per step, cap): η = 0 for step < flat, else min(rate·(step - flat), cap)
DECAY_SCHEDULES: dict[str, tuple[int, float, float]] = {
    "copy": (0, 0.0, 0.0),
    "linear_to_0_5": (0, 0.001, 0.5),
    "delayed_linear_to_0_999": (75, 0.0075, 0.999),
}


def _is_number(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def tau_at(spec: float | list | tuple, step: int) -> float:
    """EMA tau at a global step.

    Args:
        spec: a scalar tau ≥ 0, or ``[start, end, s0, s1]`` with ``s0 ≤ s1``: ``start`` for ``step ≤ s0``,
            ``end`` for ``step ≥ s1``, linear in between.
        step: the global step.

    Returns:
        tau as a float.
    """
    if _is_number(spec):
        if spec < 0:
            raise ValueError(f"nft_tau must be ≥ 0, got {spec!r}")
        return float(spec)
    if not isinstance(spec, (list, tuple)) or len(spec) != 4 or not all(_is_number(v) for v in spec):
        raise ValueError(f"nft_tau must be a number or [start, end, s0, s1] of numbers, got {spec!r}")
    start, end, s0, s1 = (float(v) for v in spec)
    if s1 < s0 or start < 0 or end < 0:
        raise ValueError(f"nft_tau {list(spec)!r}: need start, end ≥ 0 and s0 ≤ s1")
    if step <= s0:
        return start
    if step >= s1:
        return end
    return start + (end - start) * (step - s0) / (s1 - s0)


def decay_at(kind: str, step: int) -> float:
    """Official DiffusionNFT EMA decay η after ``step`` optimizer steps (module docstring); use ``tau = 1 - η`` with
    ``ema_update_``."""
    if kind not in DECAY_SCHEDULES:
        raise ValueError(f"unknown EMA decay kind {kind!r}; valid: {sorted(DECAY_SCHEDULES)}")
    flat, rate, cap = DECAY_SCHEDULES[kind]
    if step < flat:
        return 0.0
    return min(rate * (step - flat), cap)


@torch.no_grad()
def ema_update_(ema_params: Iterable[Tensor], params: Iterable[Tensor], tau: float) -> None:
    """In place ``ema ← (1 - tau)·ema + tau·θ`` (``ema ← θ`` when tau ≥ 1; nothing when tau = 0).

    Args:
        ema_params: EMA tensors, updated in place (any float dtype; θ is cast to it).
        params: current parameters θ, same count and shapes, in the same order.
        tau: ≥ 0.
    """
    ema_params, params = list(ema_params), list(params)
    if len(ema_params) != len(params):
        raise ValueError(f"ema_params has {len(ema_params)} tensors but params has {len(params)}")
    if not tau >= 0:
        raise ValueError(f"tau must be ≥ 0, got {tau!r}")
    for i, (e, p) in enumerate(zip(ema_params, params)):
        if e.shape != p.shape:
            raise ValueError(f"tensor {i}: ema shape {tuple(e.shape)} != param shape {tuple(p.shape)}")
    if tau == 0 or not ema_params:
        return
    sources = [p.detach().to(device=e.device, dtype=e.dtype) for e, p in zip(ema_params, params)]
    if tau >= 1:
        torch._foreach_copy_(ema_params, sources)
    else:
        torch._foreach_lerp_(ema_params, sources, float(tau))
