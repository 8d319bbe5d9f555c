"""Advantage Weighted Matching (``algorithm.name: awm``): on-policy rollouts from the trained adapter with the
recipe's ODE sampler (AWM is solver-agnostic: the official code samples with the stochastic SA-Solver, Flow-Factory
with ODE dynamics), the loss of :func:`rlrunner.algorithms.awm_loss.awm_loss` on forward-noised rollout latents.

Each optimizer step makes ``awm_timesteps_per_sample`` loss passes over every sample (:meth:`AWMObjective.draws`),
each at its own noise level with fresh noise from the sample's generator (seeded by sample position and pass,
never by rank). ``awm_timesteps`` picks the noise levels (:data:`TIMESTEPS`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlrunner.algorithms.awm_loss import awm_band_index, awm_loss
from rlrunner.algorithms.samplers import sample_xt
from rlrunner.distributed.parallelize import Engine
from rlrunner.models import EMA_ADAPTER, TRAINED_ADAPTER, FlowModel
from rlrunner.objectives.base import MicroBatch, Objective

Tensor = torch.Tensor


def _sampler_band(model: FlowModel, micro: MicroBatch, alg: Any, num_steps: int) -> tuple[Tensor, Tensor]:
    """The official ``discrete_wo_init``: t = σ_k of the rollout sampler's own (shifted) grid, k from stratum
    ``micro.draw`` of the band 1 ≤ k < ⌊N·awm_timestep_fraction⌋ (:func:`awm_band_index`). Returns (t [B], ε)."""
    x0 = micro.x0
    u, noise = [], []
    for generator in micro.generators:  # per sample: its uniform, then its ε
        u.append(torch.rand((), generator=generator))
        noise.append(torch.randn(x0.shape[1:], generator=generator, dtype=torch.float32))
    k = awm_band_index(torch.stack(u), num_steps, float(alg.awm_timestep_fraction), micro.draw,
                       int(alg.awm_timesteps_per_sample))
    return model.sigmas(num_steps)[k], torch.stack(noise)


def _uniform_grid(model: FlowModel, micro: MicroBatch, alg: Any, num_steps: int) -> tuple[Tensor, Tensor]:
    """NFT's grid (:func:`sample_xt`): t = linspace(1, 0, N + 1)[k], k ~ U{0..N-1} per draw. Returns (t [B], ε)."""
    _, t, noise = sample_xt(micro.x0, num_steps, generator=micro.generators)
    return t, noise.float()


# awm_timesteps -> (model, micro-batch, algorithm config, rollout steps N) -> (t [B] float32, ε [B, ...] float32)
TIMESTEPS: dict[str, Callable[[FlowModel, MicroBatch, Any, int], tuple[Tensor, Tensor]]] = {
    "sampler": _sampler_band,
    "uniform": _uniform_grid,
}


class AWMObjective(Objective):
    loss_key = "awm_loss"
    sampling_adapter = TRAINED_ADAPTER  # on-policy, as every official AWM recipe (off_policy=False)

    def draws(self) -> int:
        return int(self.alg.awm_timesteps_per_sample)  # official train_timesteps, 6

    def loss(self, model: FlowModel, engine: Engine, micro: MicroBatch) -> tuple[Tensor, dict[str, float]]:
        """AWM loss at x_t = (1 - t)·x0 + t·ε with fresh ε; the anchors' velocities only when their coefficient
        is positive (adapters off for ``ref_kl_coef``, the EMA adapter for ``awm_ema_kl_coef``)."""
        alg, device = self.alg, model.device
        t, noise = TIMESTEPS[alg.awm_timesteps](model, micro, alg, int(self.family.num_steps))
        x0 = micro.x0.float()
        t_b = t.reshape(-1, *([1] * (x0.dim() - 1)))
        # float32 latents: the model casts its input to its own dtype and returns velocities in the input's
        # dtype, so the AWM loss runs in float32 even for a bf16 transformer
        x_t = ((1 - t_b) * x0 + t_b * noise).to(device)
        x0, noise, t = x0.to(device), noise.to(device), t.to(device)
        with torch.no_grad():
            v_ref = model.velocity(x_t, t, micro.cond, adapter=None) if alg.ref_kl_coef > 0 else None
            v_ema = model.velocity(x_t, t, micro.cond, adapter=EMA_ADAPTER) if alg.awm_ema_kl_coef > 0 else None
        v_theta = engine.velocity(x_t, t, micro.cond)  # the trained adapter, through DDP / FSDP2
        return awm_loss(
            v_theta, x0, noise, t, micro.advantages.to(device), weighting=alg.awm_weighting,
            ghuber_power=alg.awm_ghuber_power, adv_clip_max=alg.adv_clip_max, v_ref=v_ref, kl_coef=alg.ref_kl_coef,
            v_ema=v_ema, ema_kl_coef=alg.awm_ema_kl_coef,
        )
