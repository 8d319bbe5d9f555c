"""Rollout worker: holds the model with the EMA ("old") adapter and samples groups of images or videos."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlrunner.batch import Batch
from rlrunner.models import EMA_ADAPTER, TRAINED_ADAPTER, build_model
from rlrunner.utils.seeding import derive_seed


class RolloutWorker:
    """Samples final clean latents ``x0`` with the ODE sampler and decodes them for the reward.

    Decoding happens here rather than in the env worker so that one copy of the VAE serves a device; the env
    worker receives uint8 pixels, which it needs anyway for OCR.
    """

    def __init__(self, model_cfg: Any, seed: int, *, rank: int = 0, world_size: int = 1) -> None:
        torch.manual_seed(derive_seed(seed, "rollout-init", rank, 0))
        self.model = build_model(model_cfg)
        self.family_cfg = model_cfg[model_cfg.model_type]
        self.seed, self.rank = seed, rank

    @torch.no_grad()
    def generate(self, prompts: list[str], group_size: int, step: int, chunk: int, mode: str = "train") -> Batch:
        """Sample ``group_size`` images for each of ``prompts`` (groups contiguous).

        Returns a Batch with tensors ``x0`` ``[N, *latent_shape]``, the conditioning tensors (``cond.<name>``,
        ``[N, ...]``), ``images`` uint8 ``[N, H, W, 3]`` (or ``[N, F, H, W, 3]``), and meta ``prompts``;
        ``N = len(prompts) * group_size``. Noise is seeded from (seed, mode, rank, step, chunk), so any rollout
        can be replayed.
        """
        train = mode == "train"
        cfg = self.family_cfg
        guidance = cfg.guidance_scale if train else cfg.eval_guidance_scale
        # text encoders run once per prompt; the embeddings are repeated for the group
        cond = self.model.repeat_cond(self.model.encode_prompts(prompts), group_size)
        n = len(prompts) * group_size
        generator = torch.Generator().manual_seed(derive_seed(self.seed, f"rollout-{mode}", self.rank, step, chunk))
        noise = torch.randn((n, *self.model.latent_shape), generator=generator).to(self.model.device)
        x0 = self.model.sample(
            cond, noise, sampler=cfg.train_sampler if train else cfg.eval_sampler,
            num_steps=cfg.num_steps if train else cfg.eval_num_steps, guidance_scale=guidance,
            adapter=EMA_ADAPTER if train else TRAINED_ADAPTER,
        )
        images = self.model.decode(x0)
        tensors = {"x0": x0.float().cpu(), "images": torch.from_numpy(np.ascontiguousarray(images))}
        tensors.update({f"cond.{k}": v.cpu() for k, v in cond.items()})
        return Batch(tensors, {"prompts": [p for p in prompts for _ in range(group_size)]})

    def offload(self) -> None:
        """Free the device for a collocated actor (``cluster.enable_offload``)."""
        self.model.offload_transformer(True)

    def onload(self) -> None:
        self.model.offload_transformer(False)

    def sync_weights(self, adapters: dict[str, dict[str, torch.Tensor]]) -> None:
        """Load LoRA tensors (only the adapters, never base weights) sent by the actor."""
        for name, state in adapters.items():
            self.model.load_lora_state_dict(name, state)
