"""FLUX.1 (``model_type: flux1``): FluxTransformer2DModel + AutoencoderKL (16 channels) + CLIP (pooled) + T5.

Mirrors ``diffusers.FluxPipeline``:

* prompts are encoded by the pipeline's ``encode_prompt``: T5 token states ``[B, L, 4096]`` (always padded to
  ``max_sequence_length``) and CLIP's pooled output ``[B, 768]``; ``txt_ids`` are zeros ``[L, 3]``.
* latents ``[B, 16, H/8, W/8]`` are packed into 2x2 patches ``[B, (H/16)(W/16), 64]`` for the transformer, with
  ``img_ids`` ``[(H/16)(W/16), 3]`` (row, column) from the pipeline's ``_prepare_latent_image_ids``; the transformer
  takes ``timestep = sigma`` (the pipeline divides its 1000-scale timestep by 1000).
* the schedule: sigmas ``linspace(1, 1/N, N)`` shifted by ``exp(mu)``, ``mu`` from the image token count
  (:func:`~rlrunner.models.schedules.token_shift_kwargs`; FLUX.1-dev's scheduler config gives shift 1.88 at 512 px,
  3.16 at 1024 px; schnell's config turns the dynamic shift off).
* guidance, decided by the folder's ``transformer/config.json`` ``guidance_embeds``: ``embedded`` (FLUX.1-dev, Krea:
  the scale is a transformer input, one pass) where it is true; ``none`` (schnell) or ``cfg`` (the pipeline's
  ``true_cfg_scale`` with the negative prompt, plain combination) where it is false.
* decoding: ``vae.decode(latents / scaling_factor + shift_factor)`` in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlrunner.models.base import Cond, FlowModel
from rlrunner.models.guidance import recipe_kind
from rlrunner.models.pixels import check_divisible, decode_scaled_latents, resolution_hw
from rlrunner.models.qwen_image import pack_latents, unpack_latents
from rlrunner.models.schedules import scaled_timestep, token_shift_kwargs
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.shapes import SampleShapes

#: the joint-attention projections of both streams (double blocks; ``attn.to_q/k/v`` also match the single blocks'
#: attention) and both streams' feed-forward layers: the targets of flow_grpo's ``scripts/train_flux.py`` and of
#: Flow-Factory's FLUX.1 adapter (``default_target_modules``); neither adapts the single blocks' ``proj_mlp`` /
#: ``proj_out``
FLUX1_LORA_TARGETS = (
    "attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0",
    "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
    "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2",
)


@dataclass
class Flux1Settings(FamilyConfig):
    """``actor.model.flux1``: FLUX.1-dev as flow_grpo trains it: 512 px, embedded guidance 3.5, LoRA 64/128, T5 512
    tokens (the pipeline's)."""

    guidance_scale: float = 3.5
    eval_guidance_scale: float = 3.5
    lora_rank: int = 64
    lora_alpha: int = 128
    max_sequence_length: int = 512


class Flux1FlowModel(FlowModel):
    """FLUX.1 behind :class:`~rlrunner.models.base.FlowModel`.

    Conditioning: ``prompt_embeds [B, max_sequence_length, 4096]``, ``pooled_prompt_embeds [B, 768]`` (FLUX.1 sizes).
    Latents: ``[B, 16, H/8, W/8]`` (unpacked; packed only around the transformer call).
    """

    model_type = "flux1"
    settings_type = Flux1Settings
    pipeline_class_name = "FluxPipeline"
    lora_loader_class_name = "FluxLoraLoaderMixin"
    text_encoder_names = ("text_encoder", "text_encoder_2")
    vae_class_name = "AutoencoderKL"
    lora_target_modules = FLUX1_LORA_TARGETS
    # first = the default of a guidance-embedding transformer (dev); guidance_kind reads the folder
    guidance_kinds = ("embedded", "none", "cfg")

    @classmethod
    def guidance_kind(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> str:
        """By the transformer config's ``guidance_embeds``: ``auto`` is ``embedded`` where it is true (dev), ``none``
        where false (schnell); ``ValueError`` (one line) when the recipe's kind or scale does not fit it: ``embedded``
        needs it true, ``none`` / ``cfg`` need it false (a guidance-distilled transformer always takes a guidance
        input, which true CFG would leave undefined). Without the folder's configs: the recipe alone."""
        if "transformer" not in configs:
            return super().guidance_kind(family_cfg, configs)
        embeds = bool(configs["transformer"].get("guidance_embeds", False))
        key = f"actor.model.{cls.model_type}"
        kind = recipe_kind(cls, family_cfg)
        if kind is None:
            kind = "embedded" if embeds else "none"
        elif (kind == "embedded") != embeds:
            has = "has" if embeds else "has no"
            fits = "embedded" if embeds else "none or cfg"
            raise ValueError(f"{key}.guidance={kind!r} but this FLUX.1 transformer {has} guidance embedding "
                             f"(guidance_embeds: {str(embeds).lower()}); use auto or {fits}")
        if kind == "none" and (family_cfg.guidance_scale != 1 or family_cfg.eval_guidance_scale != 1):
            raise ValueError(f"{key}: this FLUX.1 transformer samples without guidance (guidance_embeds: false, "
                             f"guidance {kind}), but guidance_scale={family_cfg.guidance_scale} / eval_guidance_scale="
                             f"{family_cfg.eval_guidance_scale}; set both to 1.0 or guidance: cfg")
        return kind

    def schedule_kwargs(self, num_steps: int) -> dict[str, Any]:
        """The pipeline's rule: sigmas ``linspace(1, 1/N, N)`` shifted by ``exp(mu)``, ``mu`` from the image's token
        count (when the scheduler config's ``use_dynamic_shifting`` is on)."""
        return token_shift_kwargs(dict(self.pipe.scheduler.config), num_steps, self.shapes.image_tokens)

    @classmethod
    def sample_shapes(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> SampleShapes:
        """Shapes at ``family_cfg``'s settings from the component configs, by the pipeline's rules.

        Latent ``(in_channels / 4, H/f, W/f)`` with the VAE factor ``f = 2^(levels - 1)``, packed in 2x2 patches for
        the transformer; ``prompt_embeds``: ``max_sequence_length`` T5 tokens, ``joint_attention_dim`` wide.
        """
        height, width = resolution_hw(family_cfg.resolution)
        transformer = configs["transformer"]
        factor = 2 ** (len(configs["vae"]["block_out_channels"]) - 1)
        check_divisible(height, width, factor * 2, "flux1")
        if int(family_cfg.max_sequence_length) > 512:
            raise ValueError(f"actor.model.flux1.max_sequence_length={family_cfg.max_sequence_length} exceeds the "
                             f"pipeline's 512 T5 tokens")
        latent = (int(transformer["in_channels"]) // 4, height // factor, width // factor)
        text_tokens = int(family_cfg.max_sequence_length)
        cond = {"prompt_embeds": ((text_tokens, int(transformer["joint_attention_dim"])), None),
                "pooled_prompt_embeds": ((int(transformer["pooled_projection_dim"]),), None)}
        return SampleShapes(latent, cond, pixels=(height, width, 3), text_tokens=text_tokens,
                            image_tokens=(latent[1] // 2) * (latent[2] // 2))

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """``{"prompt_embeds": [B, L, D], "pooled_prompt_embeds": [B, P]}`` in the model dtype."""
        with self.text_encoders_on_device():
            embeds, pooled, _ = self.pipe.encode_prompt(
                prompt=list(prompts), prompt_2=None, device=self.device,
                max_sequence_length=int(self.cfg.max_sequence_length),
            )
        return {"prompt_embeds": embeds.to(self.dtype), "pooled_prompt_embeds": pooled.to(self.dtype)}

    def _predict_velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: Cond,
                          guidance: torch.Tensor | None = None) -> torch.Tensor:
        """latents ``[B, C, h, w]``, t ``[B]`` sigmas, guidance ``[B]`` (embedded only) -> v ``[B, C, h, w]``."""
        batch, _, h, w = latents.shape
        embeds = cond["prompt_embeds"]
        img_ids = self.pipe._prepare_latent_image_ids(batch, h // 2, w // 2, latents.device, self.dtype)
        packed = self.transformer(
            hidden_states=pack_latents(latents.to(self.dtype)),
            timestep=scaled_timestep(t, self.dtype),  # the pipeline's bf16(1000 sigma) / 1000
            guidance=guidance,
            pooled_projections=cond["pooled_prompt_embeds"],
            encoder_hidden_states=embeds,
            txt_ids=torch.zeros(embeds.shape[1], 3, device=latents.device, dtype=self.dtype),
            img_ids=img_ids,
            return_dict=False,
        )[0]
        return unpack_latents(packed, h, w)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """latents ``[B, C, h, w]`` -> uint8 ``[B, H, W, 3]``, decoded in float32."""
        with self.vae_on_device() as vae:
            return decode_scaled_latents(vae, latents, self.device, self.decode_batch_size)
