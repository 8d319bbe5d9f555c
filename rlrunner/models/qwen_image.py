"""Qwen-Image (``model_type: qwen_image``): QwenImageTransformer2DModel + AutoencoderKLQwenImage + Qwen2.5-VL.

Mirrors ``diffusers.QwenImagePipeline``:

* prompts are encoded by the pipeline's ``encode_prompt`` (chat template, last hidden state, template tokens
  dropped); embeddings are padded to the longest prompt of the batch and come with a 0/1 mask. The pipeline
  passes ``mask = None`` when nothing is padded; we keep the mask in the conditioning (so batches concatenate)
  and hand ``None`` to the transformer in exactly that case.
* latents ``[B, 16, H/8, W/8]`` are packed into 2x2 patches ``[B, (H/16)(W/16), 64]`` for the transformer and
  unpacked after; ``img_shapes = [(1, H/16, W/16)]`` per sample; the transformer takes ``timestep = sigma``
  (as the pipeline's ``bf16(1000 sigma) / 1000`` in bf16).
* guidance (``true_cfg_scale``): the plain combination rescaled, per packed token, to the conditional
  prediction's norm (:meth:`QwenImageFlowModel.combine_guidance`).
* decoding: ``vae.decode(latents * latents_std + latents_mean)`` on a 1-frame video, in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rlrunner.models.base import Cond, FlowModel
from rlrunner.models.lora import MMDIT_LORA_TARGETS, last_block_text_stream
from rlrunner.models.pixels import check_divisible, resolution_hw, to_uint8, vae_latent_stats
from rlrunner.models.ragged_text import concat_padded
from rlrunner.models.schedules import scaled_timestep, token_shift_kwargs
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.shapes import SampleShapes


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """``[B, C, h, w]`` -> ``[B, (h/2)(w/2), 4C]`` (the pipeline's ``_pack_latents``)."""
    b, c, h, w = latents.shape
    latents = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return latents.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(packed: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``[B, (h/2)(w/2), 4C]`` -> ``[B, C, h, w]`` (the pipeline's ``_unpack_latents`` without the frame axis)."""
    b, _, channels = packed.shape
    latents = packed.view(b, h // 2, w // 2, channels // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return latents.reshape(b, channels // 4, h, w)


def pad_text(embeds: torch.Tensor, mask: torch.Tensor, multiple: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, L, D]`` embeddings and their ``[B, L]`` mask zero-padded to a multiple of ``multiple`` tokens."""
    pad = -embeds.shape[1] % multiple
    return F.pad(embeds, (0, 0, 0, pad)), F.pad(mask, (0, pad))


@dataclass
class QwenImageSettings(FamilyConfig):
    """``actor.model.qwen_image``: 512 px, LoRA 64/128 and 512 text tokens."""

    lora_rank: int = 64
    lora_alpha: int = 128
    max_sequence_length: int = 512


class QwenImageFlowModel(FlowModel):
    """Qwen-Image behind :class:`~rlrunner.models.base.FlowModel`.

    Conditioning: ``prompt_embeds [B, L, 3584]`` and ``prompt_mask [B, L]`` (int64, 1 = token, 0 = padding;
    ``L`` = longest prompt of the batch, at most ``max_sequence_length``). Latents: ``[B, 16, H/8, W/8]``.
    """

    model_type = "qwen_image"
    settings_type = QwenImageSettings
    pipeline_class_name = "QwenImagePipeline"
    lora_loader_class_name = "QwenImageLoraLoaderMixin"
    vae_class_name = "AutoencoderKLQwenImage"
    lora_target_modules = MMDIT_LORA_TARGETS
    max_text_tokens, max_text_tokens_source = 1024, "QwenImagePipeline's"
    pads_text_for_cp = True  # _predict_velocity: its prompts vary in length, padded to whole slices and masked out

    @classmethod
    def guidance_kind(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> str:
        """``cfg`` (``true_cfg_scale``); a guidance-distilled transformer, whose scale would be an input, is refused."""
        if configs.get("transformer", {}).get("guidance_embeds"):
            raise ValueError("guidance-distilled Qwen-Image transformers (guidance_embeds: true) are not supported")
        return super().guidance_kind(family_cfg, configs)

    @classmethod
    def lora_exclude_modules(cls, denoiser: torch.nn.Module) -> tuple[str, ...]:
        """The last block's text queries and text output projection: the transformer drops the text stream after it."""
        return last_block_text_stream(denoiser, ("add_q_proj", "to_add_out"))

    def schedule_kwargs(self, num_steps: int) -> dict[str, Any]:
        """The pipeline's rule: sigmas ``linspace(1, 1/N, N)`` shifted by ``exp(mu)``, ``mu`` from the image's token
        count (and stretched to the config's ``shift_terminal``)."""
        return token_shift_kwargs(dict(self.pipe.scheduler.config), num_steps, self.shapes.image_tokens)

    @classmethod
    def sample_shapes(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> SampleShapes:
        """Shapes at ``family_cfg``'s settings from the component configs, by the pipeline's rules.

        Latent ``(z_dim, H/f, W/f)`` with ``f = 2^len(temperal_downsample)``, packed in 2x2 patches for the
        transformer; ``prompt_embeds`` at most ``max_sequence_length`` tokens (the longest prompt of a batch),
        ``joint_attention_dim`` wide, and the int64 ``prompt_mask``: the sizes are that upper bound.
        """
        height, width = resolution_hw(family_cfg.resolution)
        vae, transformer = configs["vae"], configs["transformer"]
        factor = 2 ** len(vae["temperal_downsample"])
        check_divisible(height, width, factor * 2, "qwen_image")
        latent = (int(vae["z_dim"]), height // factor, width // factor)
        text_tokens = int(family_cfg.max_sequence_length)
        cond = {"prompt_embeds": ((text_tokens, int(transformer["joint_attention_dim"])), None),
                "prompt_mask": ((text_tokens,), torch.int64)}
        return SampleShapes(latent, cond, pixels=(height, width, 3), text_tokens=text_tokens,
                            image_tokens=(latent[1] // 2) * (latent[2] // 2))

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """``{"prompt_embeds": [B, L, D] (model dtype), "prompt_mask": [B, L] int64}``."""
        with self.text_encoders_on_device():
            embeds, mask = self.pipe.encode_prompt(
                prompt=list(prompts), device=self.device, max_sequence_length=int(self.cfg.max_sequence_length),
            )
        if mask is None:  # the pipeline drops an all-ones mask
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        return {"prompt_embeds": embeds.to(self.dtype), "prompt_mask": mask.long()}

    def concat_cond(self, conds: list[Cond]) -> Cond:
        """Concatenate along the batch, zero-padding embeddings and masks to the longest text."""
        return concat_padded(conds)

    def _predict_velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: Cond,
                          guidance: torch.Tensor | None = None) -> torch.Tensor:
        """latents ``[B, C, h, w]``, t ``[B]`` sigmas -> v ``[B, C, h, w]`` (model dtype)."""
        batch, _, h, w = latents.shape
        embeds, mask = cond["prompt_embeds"], cond.get("prompt_mask")
        if self.context_parallel_size > 1:  # the CP plan splits the text too: pad it to whole slices, masked out
            embeds, mask = pad_text(embeds, mask, self.context_parallel_size)
        if mask is not None and bool(mask.all()):
            mask = None  # as the pipeline: no mask when nothing is padded
        packed = self.transformer(
            hidden_states=pack_latents(latents.to(self.dtype)),
            timestep=scaled_timestep(t, self.dtype),  # the pipeline's bf16(1000 sigma) / 1000
            encoder_hidden_states=embeds,
            encoder_hidden_states_mask=mask,
            img_shapes=[[(1, h // 2, w // 2)]] * batch,
            return_dict=False,
        )[0]
        return unpack_latents(packed, h, w)

    def combine_guidance(self, v_neg: torch.Tensor, v_cond: torch.Tensor, guidance_scale: float) -> torch.Tensor:
        """The pipeline's ``true_cfg_scale`` rule on ``[B, C, h, w]`` halves: ``v_neg + g (v_cond - v_neg)``
        rescaled so that each packed token (a 2x2 patch of all channels, the pipeline's last dim) keeps the norm of
        ``v_cond``'s token. No eps, as in the pipeline: a token whose combined velocity is exactly 0 gives NaN there
        too."""
        _, _, h, w = v_cond.shape
        combined = pack_latents(super().combine_guidance(v_neg, v_cond, guidance_scale))
        cond_norm = torch.norm(pack_latents(v_cond), dim=-1, keepdim=True)
        combined_norm = torch.norm(combined, dim=-1, keepdim=True)
        return unpack_latents(combined * (cond_norm / combined_norm), h, w)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """latents ``[B, C, h, w]`` -> uint8 ``[B, H, W, 3]``, decoded in float32."""
        images = []
        with self.vae_on_device() as vae:
            mean, std = vae_latent_stats(vae, self.device)
            for part in latents.split(self.decode_batch_size):
                z = part.to(self.device, torch.float32)[:, :, None] * std + mean
                images.append(to_uint8(vae.decode(z, return_dict=False)[0][:, :, 0]))
        return np.concatenate(images)
