"""DiffusionNFT (``algorithm.name: nft``): rollouts from the EMA ("old") policy, the loss of
:func:`rlrunner.algorithms.nft.nft_loss` on forward-noised rollout latents."""

from __future__ import annotations

import torch

from rlrunner.algorithms.nft import nft_loss
from rlrunner.algorithms.samplers import sample_xt
from rlrunner.cluster.parallelize import Engine
from rlrunner.models import EMA_ADAPTER, FlowModel
from rlrunner.objectives.base import MicroBatch, Objective

Tensor = torch.Tensor


class NFTObjective(Objective):
    loss_key = "nft_loss"
    sampling_adapter = EMA_ADAPTER

    def draws(self) -> int:
        return int(self.alg.nft_timesteps_per_sample)  # noise levels per sample, each with fresh noise

    def loss(self, model: FlowModel, engine: Engine, micro: MicroBatch) -> tuple[Tensor, dict[str, float]]:
        """NFT loss with fresh noise: x_t from the rollout's x0 (``nft_xcur_source: resample``)."""
        alg, device = self.alg, model.device
        x0 = micro.x0
        x_t, t, _ = sample_xt(x0, int(self.family.num_steps), generator=micro.generators)
        # float32 latents: the model casts its input to its own dtype and returns velocities in the input's
        # dtype, so the NFT loss runs in float32 even for a bf16 transformer
        x0, x_t, t = x0.to(device), x_t.to(device), t.to(device)
        with torch.no_grad():
            v_old = model.velocity(x_t, t, micro.cond, adapter=EMA_ADAPTER)
            v_base = model.velocity(x_t, t, micro.cond, adapter=None) if alg.ref_kl_coef > 0 else None
        v_theta = engine.velocity(x_t, t, micro.cond)  # the trained adapter, through DDP / FSDP2
        return nft_loss(
            v_theta, v_old, x_t, x0, t, micro.advantages.to(device), beta=alg.nft_beta, adv_clip_max=alg.adv_clip_max,
            weight_mode=alg.nft_weight_mode, target_space=alg.nft_target_space, clip_ratio=alg.nft_clip_ratio,
            v_base=v_base, kl_coef=alg.ref_kl_coef,
        )
