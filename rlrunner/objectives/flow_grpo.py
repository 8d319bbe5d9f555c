"""Flow-GRPO (``algorithm.name: flow_grpo``): on-policy SDE rollouts with the trained adapter, and GRPO's clipped
loss on the log-probabilities of the sampled steps (:mod:`rlrunner.algorithms.flow_grpo_loss`).

Plain Flow-GRPO (``flow_grpo_sde_window_size: 0``) samples every step with the SDE; Flow-GRPO-Fast samples a
window of a few consecutive early steps with it and the others with Euler's ODE step. Each sample trains on
``max(1, int(flow_grpo_timestep_fraction · SDE steps))`` of its SDE steps, drawn at random per sample; the
rollout keeps only those steps (state before and after, step index, log-prob), and the actor makes one loss pass
per trained step (:meth:`FlowGRPOObjective.draws`).
"""

from __future__ import annotations

import torch

from rlrunner.algorithms.flow_grpo_loss import (
    choose_steps,
    grpo_loss,
    sde_sample,
    sde_step_logprob,
    sde_window,
    window_range,
)
from rlrunner.distributed.parallelize import Engine
from rlrunner.models import TRAINED_ADAPTER, FlowModel
from rlrunner.objectives.base import MicroBatch, Objective

Tensor = torch.Tensor


class FlowGRPOObjective(Objective):
    loss_key = "policy_loss"
    # on-policy, as the paper: the trained adapter samples (synced to the rollout workers after every step); the
    # EMA adapter is still kept and checkpointed, but no part of Flow-GRPO reads it
    sampling_adapter = TRAINED_ADAPTER

    @property
    def num_steps(self) -> int:
        return int(self.family.num_steps)

    def sde_steps_per_sample(self) -> int:
        return int(self.alg.flow_grpo_sde_window_size) or self.num_steps

    def draws(self) -> int:
        """Trained steps per sample: ``max(1, int(timestep_fraction · SDE steps))``, as the official trainer."""
        return max(1, int(float(self.alg.flow_grpo_timestep_fraction) * self.sde_steps_per_sample()))

    def kept_latents_per_sample(self) -> int:
        return 2 * self.draws()  # state before and after each trained step

    def rollout(self, model: FlowModel, cond: dict[str, Tensor], noise: Tensor,
                generator: torch.Generator) -> tuple[Tensor, dict[str, Tensor]]:
        """Sample with the SDE on each sample's window; keep ``[N, K, ...]`` states of its K trained steps."""
        alg, batch = self.alg, noise.shape[0]
        sde_steps = sde_window(batch, self.num_steps, int(alg.flow_grpo_sde_window_size),
                               window_range(alg.flow_grpo_sde_window_range, self.num_steps),
                               generator=generator, device=noise.device)
        trained = choose_steps(sde_steps, self.draws(), generator=generator)
        # the recipe's scale: validate rejects cfg above 1, and embedded guidance (FLUX.1-dev) is a model input that
        # the loss's velocity (FlowModel.velocity) feeds at this scale too, so log-probs are of the same policy
        velocity_fn = model.guided_velocity_fn(cond, model.resolved_guidance.scale)
        with model.use_adapter(self.sampling_adapter):
            x0, record = sde_sample(velocity_fn, noise, model.sigmas(self.num_steps, noise.device), sde_steps,
                                    float(alg.flow_grpo_noise_level), generator, record_steps=trained)
        return x0, {"sde_x": record.x, "sde_x_next": record.x_next, "sde_log_prob": record.log_prob,
                    "sde_step": record.step}

    def loss(self, model: FlowModel, engine: Engine, micro: MicroBatch) -> tuple[Tensor, dict[str, float]]:
        """GRPO loss on trained step ``micro.draw`` of each sample: log π_θ of the stored next state under v_θ."""
        alg, device, k = self.alg, model.device, micro.draw
        x = micro.tensors["sde_x"][:, k].to(device)
        x_next = micro.tensors["sde_x_next"][:, k].to(device)
        step = micro.tensors["sde_step"][:, k].to(device)
        sigmas = model.sigmas(self.num_steps, device)
        sigma, sigma_next = sigmas[step], sigmas[step + 1]
        noise_level = float(alg.flow_grpo_noise_level)

        def step_logprob(v: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
            return sde_step_logprob(v, x, sigma, sigma_next, float(sigmas[1]), noise_level, prev_sample=x_next)

        _, log_prob, mean, std = step_logprob(engine.velocity(x, sigma, micro.cond))  # the trained adapter
        ref_mean = None
        if alg.ref_kl_coef > 0:  # the reference policy is the base model
            with torch.no_grad():
                _, _, ref_mean, _ = step_logprob(model.velocity(x, sigma, micro.cond, adapter=None))
        return grpo_loss(log_prob, micro.tensors["sde_log_prob"][:, k].to(device), micro.advantages.to(device),
                         clip_range=float(alg.flow_grpo_clip_range), adv_clip_max=float(alg.adv_clip_max),
                         mean=mean, ref_mean=ref_mean, std=std, kl_coef=float(alg.ref_kl_coef))
