"""Stable Diffusion 3 / 3.5 (``model_type: sd3``): SD3Transformer2DModel + AutoencoderKL + 2x CLIP + T5.

Mirrors ``diffusers.StableDiffusion3Pipeline``: prompts are encoded by the pipeline's own ``encode_prompt``
(CLIP penultimate hidden states padded to T5 width and concatenated with T5 tokens, pooled CLIP outputs),
the transformer gets ``timestep = 1000 * sigma``, and latents are decoded as
``vae.decode(latents / scaling_factor + shift_factor)`` in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlrunner.models.base import Cond, FlowModel
from rlrunner.models.lora import MMDIT_LORA_TARGETS, last_block_text_stream
from rlrunner.models.pixels import check_divisible, decode_scaled_latents, resolution_hw
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.shapes import SampleShapes

CLIP_TOKENS = 77  # the SD3 pipeline's CLIP tokenizer length when it has no tokenizer to ask


class SD3FlowModel(FlowModel):
    """SD3 family behind :class:`~rlrunner.models.base.FlowModel`.

    Conditioning: ``prompt_embeds [B, 77 + max_sequence_length, 4096]``, ``pooled_prompt_embeds [B, 2048]``
    (SD3.5-Medium sizes). Latents: ``[B, 16, H/8, W/8]``.
    """

    model_type = "sd3"
    settings_type = FamilyConfig  # 512 px and 256 T5 tokens: the shared defaults
    pipeline_class_name = "StableDiffusion3Pipeline"
    lora_loader_class_name = "SD3LoraLoaderMixin"
    text_encoder_names = ("text_encoder", "text_encoder_2", "text_encoder_3")
    vae_class_name = "AutoencoderKL"
    lora_target_modules = MMDIT_LORA_TARGETS
    max_text_tokens, max_text_tokens_source = 512, "T5's"

    @classmethod
    def lora_exclude_modules(cls, denoiser: torch.nn.Module) -> tuple[str, ...]:
        """The last block's text queries: that block is ``context_pre_only`` (its text output is never computed)."""
        return last_block_text_stream(denoiser, ("add_q_proj",))

    @classmethod
    def sample_shapes(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> SampleShapes:
        """Shapes at ``family_cfg``'s settings from the component configs, by the pipeline's rules.

        Latent ``(C, H/f, W/f)`` with the VAE factor ``f = 2^(levels - 1)``; ``prompt_embeds``: the CLIP length
        (``max_position_embeddings``, 77) plus ``max_sequence_length`` T5 tokens, ``joint_attention_dim`` wide.
        """
        height, width = resolution_hw(family_cfg.resolution)
        transformer = configs["transformer"]
        factor, patch = 2 ** (len(configs["vae"]["block_out_channels"]) - 1), int(transformer["patch_size"])
        check_divisible(height, width, factor * patch, "sd3")
        latent = (int(transformer["in_channels"]), height // factor, width // factor)
        # CLIP's length; 77, as the pipeline assumes, for a pipeline built without text encoders
        clip_tokens = configs.get("text_encoder", {}).get("max_position_embeddings", CLIP_TOKENS)
        text_tokens = int(clip_tokens) + int(family_cfg.max_sequence_length)
        cond = {"prompt_embeds": ((text_tokens, int(transformer["joint_attention_dim"])), None),
                "pooled_prompt_embeds": ((int(transformer["pooled_projection_dim"]),), None)}
        return SampleShapes(latent, cond, pixels=(height, width, 3), text_tokens=text_tokens,
                            image_tokens=(latent[1] // patch) * (latent[2] // patch))

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """``{"prompt_embeds": [B, L, D], "pooled_prompt_embeds": [B, P]}`` in the model dtype."""
        with self.text_encoders_on_device():
            embeds, _, pooled, _ = self.pipe.encode_prompt(
                prompt=list(prompts), prompt_2=None, prompt_3=None, device=self.device,
                do_classifier_free_guidance=False, max_sequence_length=int(self.cfg.max_sequence_length),
            )
        return {"prompt_embeds": embeds.to(self.dtype), "pooled_prompt_embeds": pooled.to(self.dtype)}

    def _predict_velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: Cond,
                          guidance: torch.Tensor | None = None) -> torch.Tensor:
        """latents ``[B, C, h, w]``, t ``[B]`` sigmas -> v ``[B, C, h, w]`` (model dtype)."""
        return self.transformer(
            hidden_states=latents.to(self.dtype),
            timestep=t.float() * 1000,
            encoder_hidden_states=cond["prompt_embeds"],
            pooled_projections=cond["pooled_prompt_embeds"],
            return_dict=False,
        )[0]

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """latents ``[B, C, h, w]`` -> uint8 ``[B, H, W, 3]``, decoded in float32."""
        with self.vae_on_device() as vae:
            return decode_scaled_latents(vae, latents, self.device, self.decode_batch_size)
