"""Sampling schedules as each family's diffusers pipeline computes them, read from the model folder's scheduler.

A family's *schedule rule* is the keyword arguments its pipeline passes to ``scheduler.set_timesteps`` (the step
count, or explicit sigmas and a ``mu``); :func:`pipeline_sigmas` hands them to a fresh copy of the folder's own
scheduler and reads back the sigma grid, so every shift, dynamic (token-count) shift and terminal stretch in the
scheduler config applies exactly as in the pipeline. The rules:

* ``num_inference_steps`` alone (SD3, Wan): the scheduler's own spacing with its static ``shift`` / ``flow_shift``;
* :func:`token_shift_kwargs` (FLUX.1, Qwen-Image): sigmas ``linspace(1, 1/N, N)`` and ``mu`` interpolated by the
  image's token count between ``base_shift`` and ``max_shift`` (``calculate_shift``);
* FLUX.2 and Z-Image build their own ``mu`` / sigmas in their family files, with their pipelines' functions.

A recipe's number in ``shift`` replaces the rule with the plain shifted grid of
:func:`rlrunner.algorithms.samplers.sigma_schedule`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def token_shift_mu(scheduler_config: dict[str, Any], image_tokens: int) -> float:
    """``mu`` of the FLUX.1 / Qwen-Image pipelines: linear in the token count from ``base_shift`` (at
    ``base_image_seq_len``) to ``max_shift`` (at ``max_image_seq_len``), with the pipelines' defaults."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    return float(calculate_shift(
        image_tokens,
        scheduler_config.get("base_image_seq_len", 256),
        scheduler_config.get("max_image_seq_len", 4096),
        scheduler_config.get("base_shift", 0.5),
        scheduler_config.get("max_shift", 1.15),
    ))


def token_shift_kwargs(scheduler_config: dict[str, Any], num_steps: int, image_tokens: int) -> dict[str, Any]:
    """``set_timesteps`` arguments of the FLUX.1 / Qwen-Image pipelines (``mu`` only matters with the config's
    ``use_dynamic_shifting``)."""
    return {"sigmas": np.linspace(1.0, 1 / num_steps, num_steps).tolist(),
            "mu": token_shift_mu(scheduler_config, image_tokens)}


def _fresh_schedule(scheduler: Any, set_timesteps_kwargs: dict[str, Any]) -> Any:
    """A fresh scheduler of ``scheduler``'s class and config after ``set_timesteps(**kwargs)`` (the caller's
    scheduler is not touched)."""
    fresh = type(scheduler).from_config(scheduler.config)
    fresh.set_timesteps(**set_timesteps_kwargs, device="cpu")
    return fresh


def pipeline_sigmas(scheduler: Any, set_timesteps_kwargs: dict[str, Any]) -> torch.Tensor:
    """The ``[N + 1]`` float32 sigma grid (1 → 0) that ``scheduler.set_timesteps(**kwargs)`` produces, on a fresh
    scheduler of the same class and config (the caller's scheduler is not touched)."""
    fresh = _fresh_schedule(scheduler, set_timesteps_kwargs)
    sigmas = torch.as_tensor(fresh.sigmas, dtype=torch.float32).flatten()
    if sigmas.numel() < 2 or float(sigmas[-1]) != 0.0:
        raise ValueError(f"{type(scheduler).__name__}.set_timesteps({set_timesteps_kwargs}) gave sigmas ending at "
                         f"{float(sigmas[-1]):.4g}, not 0; set the family's shift to sample on rlrunner's own grid")
    return sigmas


def pipeline_timestep_dtype(scheduler: Any, set_timesteps_kwargs: dict[str, Any]) -> torch.dtype:
    """The dtype of the timesteps ``scheduler.set_timesteps(**kwargs)`` hands the pipeline's loop: float32 for the
    flow-matching Euler scheduler, int64 (``1000 * sigma`` truncated) for UniPC and the other multistep solvers."""
    return _fresh_schedule(scheduler, set_timesteps_kwargs).timesteps.dtype


def integer_timestep(sigma: torch.Tensor) -> torch.Tensor:
    """``[B]`` sigmas -> the int64 ``1000 * sigma`` (truncated) that a multistep scheduler (Wan's UniPC) gives its
    pipeline: ``(sigmas * num_train_timesteps).astype(int64)``. The product is rounded in float32: where the
    scheduler's float64 ``1000 * sigma`` is a whole number (sigma 0.95), the float32 sigma times 1000 in float64
    would fall just below it and truncate one lower."""
    return (sigma.float() * 1000).to(torch.int64)


def scaled_timestep(sigma: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B]`` sigmas -> ``timestep / 1000`` as the FLUX.1, FLUX.2 and Qwen-Image pipelines pass it: the float32
    ``1000 * sigma`` cast to the model dtype, then divided by 1000 in that dtype. In bf16 this differs from
    ``sigma.to(bf16)`` by one bf16 step for about a quarter of the sigmas."""
    return (sigma.float() * 1000).to(dtype) / 1000
