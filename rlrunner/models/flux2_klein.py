"""FLUX.2-klein 4B / 9B (``model_type: flux2_klein``): Flux2Transformer2DModel + AutoencoderKLFlux2 + Qwen3.

Mirrors ``diffusers.Flux2KleinPipeline``:

* prompts go through the Qwen3 chat template (thinking off), padded to ``max_sequence_length``; the conditioning is
  the hidden states of layers 9, 18 and 27 stacked along the feature axis (``[B, L, 3 * hidden]``). The
  transformer sees the padding tokens (the pipeline passes no mask), so neither do we.
* the flow lives in the transformer's latent space: the VAE's ``[B, 32, H/8, W/8]`` latents in 2x2 patches
  ``[B, 128, H/16, W/16]``, normalised by the VAE's batch-norm statistics. The transformer takes them flattened to
  tokens with 4-axis position ids (``img_ids``, ``txt_ids``) and ``timestep = sigma`` (as
  the pipeline's ``bf16(1000 sigma) / 1000`` in bf16).
* guidance: ``cfg`` (klein base: ``neg + s (cond - neg)`` with the empty prompt as negative) or ``none`` (the
  step-distilled klein: the folder's ``model_index.json`` says ``is_distilled: true``; ``auto`` reads it).
* schedule: sigmas ``linspace(1, 1/N, N)`` and ``mu = compute_empirical_mu(image tokens, N)``: it depends on the
  token count *and* the step count.
* decoding: de-normalise with the batch-norm running mean / ``sqrt(var + eps)``, unpatchify, ``vae.decode``
  (float32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rlrunner.models.base import Cond, FlowModel
from rlrunner.models.guidance import recipe_kind
from rlrunner.models.pixels import check_divisible, resolution_hw, to_uint8
from rlrunner.models.schedules import scaled_timestep
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.shapes import SampleShapes

#: both streams' attention projections of the double blocks, and the fused qkv + MLP input and the output
#: projection of the single blocks, which hold most of the weights (20 of 25 blocks of the 4B): without them most
#: of the model gets no adapter. diffusers' ``train_dreambooth_lora_flux2_klein.py`` targets ``to_k, to_q, to_v,
#: to_out.0, to_qkv_mlp_proj`` and each ``single_transformer_blocks.<i>.attn.to_out``; we add the text stream's
#: projections as for the other MMDiT families. ``attn.to_out`` also names the double blocks' ``to_out`` list
#: (not a layer): :meth:`Flux2KleinFlowModel.lora_exclude_modules` leaves it out.
FLUX2_LORA_TARGETS = (
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
    "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
    "attn.to_qkv_mlp_proj", "attn.to_out",
)


def patchify(latents: torch.Tensor) -> torch.Tensor:
    """VAE latents ``[B, C, H, W]`` -> ``[B, 4C, H/2, W/2]`` (the pipeline's ``_patchify_latents``)."""
    b, c, h, w = latents.shape
    latents = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4)
    return latents.reshape(b, c * 4, h // 2, w // 2)


def unpatchify(latents: torch.Tensor) -> torch.Tensor:
    """``[B, 4C, h, w]`` -> VAE latents ``[B, C, 2h, 2w]`` (the pipeline's ``_unpatchify_latents``)."""
    b, c, h, w = latents.shape
    latents = latents.reshape(b, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3)
    return latents.reshape(b, c // 4, h * 2, w * 2)


def batch_norm_stats(vae: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's latent normalisation ``(mean, std)``, each ``[1, 4C, 1, 1]``: its batch-norm running statistics
    over patchified latents, ``std = sqrt(running_var + batch_norm_eps)``."""
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    return mean, std


@dataclass
class Flux2KleinSettings(FamilyConfig):
    """``actor.model.flux2_klein`` (FLUX.2-klein 4B / 9B): 1024^2 and 512 text tokens as Flux2KleinPipeline."""

    resolution: Any = 1024
    max_sequence_length: int = 512


class Flux2KleinFlowModel(FlowModel):
    """FLUX.2-klein behind :class:`~rlrunner.models.base.FlowModel`.

    Conditioning: ``prompt_embeds [B, L, 3 * hidden]`` (model dtype, ``L = max_sequence_length``). Latents: the
    transformer's ``[B, 128, H/16, W/16]`` (patchified, batch-norm normalised).
    """

    model_type = "flux2_klein"
    settings_type = Flux2KleinSettings
    pipeline_class_name = "Flux2KleinPipeline"
    lora_loader_class_name = "Flux2LoraLoaderMixin"
    vae_class_name = "AutoencoderKLFlux2"
    lora_target_modules = FLUX2_LORA_TARGETS
    guidance_kinds = ("cfg", "none")

    @classmethod
    def guidance_kind(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> str:
        """``none`` for the step-distilled klein (``model_index.json`` ``is_distilled: true``), else the recipe's kind
        (``auto``: ``cfg``, klein base); ``cfg`` on a distilled klein, or a transformer that embeds guidance, is
        refused."""
        if configs.get("transformer", {}).get("guidance_embeds"):
            raise ValueError("Flux2KleinPipeline passes no guidance to the transformer, but this one has "
                             "guidance_embeds: true (a FLUX.2-dev transformer?); klein folders have false")
        distilled = bool(configs.get("model_index", {}).get("is_distilled", False))
        kind = recipe_kind(cls, family_cfg)
        if distilled and kind == "cfg":
            raise ValueError("actor.model.flux2_klein.guidance=cfg on a step-distilled klein (model_index.json "
                             "is_distilled: true), whose pipeline never guides; use none or auto")
        return kind or ("none" if distilled else "cfg")

    @classmethod
    def lora_exclude_modules(cls, denoiser: nn.Module) -> tuple[str, ...]:
        """The double blocks' ``attn.to_out`` lists (a container, not a layer), which the single blocks' target
        ``attn.to_out`` also names; their layer ``attn.to_out.0`` is a target of its own."""
        return tuple(f"transformer_blocks.{i}.attn.to_out" for i in range(len(denoiser.transformer_blocks)))

    @classmethod
    def sample_shapes(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> SampleShapes:
        """Latent ``(in_channels, H/(2f), W/(2f))`` with the VAE factor ``f = 2^(len(block_out_channels) - 1)``,
        one token per cell; ``prompt_embeds`` of ``max_sequence_length`` tokens, ``joint_attention_dim`` wide."""
        height, width = resolution_hw(family_cfg.resolution)
        vae, transformer = configs["vae"], configs["transformer"]
        factor = 2 ** (len(vae["block_out_channels"]) - 1)
        check_divisible(height, width, factor * 2, "flux2_klein")
        latent = (int(transformer["in_channels"]), height // (factor * 2), width // (factor * 2))
        text_tokens = int(family_cfg.max_sequence_length)
        cond = {"prompt_embeds": ((text_tokens, int(transformer["joint_attention_dim"])), None)}
        return SampleShapes(latent, cond, pixels=(height, width, 3), text_tokens=text_tokens,
                            image_tokens=latent[1] * latent[2])

    def schedule_kwargs(self, num_steps: int) -> dict[str, Any]:
        """The pipeline's ``set_timesteps`` arguments: sigmas ``linspace(1, 1/N, N)`` (none if the scheduler makes
        flow sigmas itself) and ``mu`` from the image token count and the step count."""
        from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

        mu = compute_empirical_mu(image_seq_len=self.shapes.image_tokens, num_steps=num_steps)
        if self.pipe.scheduler.config.get("use_flow_sigmas", False):
            return {"num_inference_steps": num_steps, "mu": mu}
        return {"sigmas": np.linspace(1.0, 1 / num_steps, num_steps), "mu": mu}

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """``{"prompt_embeds": [B, L, 3 * hidden]}`` in the model dtype."""
        with self.text_encoders_on_device():
            embeds, _ = self.pipe.encode_prompt(prompt=list(prompts), device=self.device,
                                                max_sequence_length=int(self.cfg.max_sequence_length))
        return {"prompt_embeds": embeds.to(self.dtype)}

    def _predict_velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: Cond,
                          guidance: torch.Tensor | None = None) -> torch.Tensor:
        """latents ``[B, C, h, w]``, t ``[B]`` sigmas -> v ``[B, C, h, w]`` (model dtype)."""
        b, c, h, w = latents.shape
        latents = latents.to(self.dtype)
        embeds = cond["prompt_embeds"]
        out = self.transformer(
            hidden_states=latents.reshape(b, c, h * w).transpose(1, 2),
            timestep=scaled_timestep(t, self.dtype),  # the pipeline's bf16(1000 sigma) / 1000
            guidance=None,
            encoder_hidden_states=embeds,
            txt_ids=self.pipe._prepare_text_ids(embeds).to(latents.device),
            img_ids=self.pipe._prepare_latent_ids(latents).to(latents.device),
            return_dict=False,
        )[0]
        return out.transpose(1, 2).reshape(b, c, h, w)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """latents ``[B, 128, h, w]`` -> uint8 ``[B, 16h, 16w, 3]``, de-normalised and decoded in float32."""
        images = []
        with self.vae_on_device() as vae:
            mean, std = batch_norm_stats(vae)
            for part in latents.split(self.decode_batch_size):
                z = unpatchify(part.to(self.device, torch.float32) * std + mean)
                images.append(to_uint8(vae.decode(z, return_dict=False)[0]))
        return np.concatenate(images)
