"""Z-Image and Z-Image-Turbo (``model_type: zimage``): ZImageTransformer2DModel + AutoencoderKL (FLUX's 16-channel
VAE) + Qwen3.

Mirrors ``diffusers.ZImagePipeline``:

* prompts go through the Qwen3 chat template; the embeddings are the second-to-last hidden state with the padding
  dropped, one ``[L_i, D]`` tensor per prompt. We keep them padded to the batch's longest prompt with a 0/1 mask (so
  batches concatenate) and hand the transformer the list of unpadded tensors, as the pipeline does.
* the transformer takes a *list* of ``[C, 1, h, w]`` latents, time ``1 - sigma`` (0 = noise) and returns a list whose
  negation is the velocity ``eps - x0``.
* guidance (``cfg``, the base model): the pipeline combines the halves as ``pos + g (pos - neg)`` with its
  ``guidance_scale`` ``g`` (0 = off). rlrunner's ``guidance_scale`` is the usual CFG scale ``s`` of every family
  (1 = off), so ``g = s - 1``: the pipeline's published ``guidance_scale=4`` is ``guidance_scale: 5`` here. The
  pipeline's options are ``cfg_truncation`` (no guidance once ``1 - sigma`` exceeds it; 1.0 = never) and
  ``cfg_normalization`` (each sample's guided velocity is scaled down to at most that multiple of the conditional
  one's norm; 0 = off, the pipeline's ``True`` is 1.0). ``none``: Z-Image-Turbo (distilled, 8-9 steps, the pipeline's
  ``guidance_scale=0``): one pass.
* schedule: sigmas ``linspace(1, 1/N, N)`` (``get_default_z_image_sigmas``) and a token-count ``mu``, handed to the
  folder's scheduler; its config has no dynamic shifting, so the static ``shift`` applies (6.0 base, 3.0 Turbo).
* decoding: ``vae.decode(latents / scaling_factor + shift_factor)`` in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlrunner.algorithms.samplers import VelocityFn
from rlrunner.models.base import Cond, FlowModel
from rlrunner.models.pixels import check_divisible, resolution_hw, to_uint8
from rlrunner.models.ragged_text import concat_padded, stack_ragged, unstack_ragged
from rlrunner.models.schedules import token_shift_mu
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.shapes import SampleShapes

#: attention and SwiGLU projections of every block (refiners and main layers): DiffSynth-Studio's Z-Image LoRA
#: targets (``--lora_target_modules "to_q,to_k,to_v,to_out.0,w1,w2,w3"``)
ZIMAGE_LORA_TARGETS = (
    "attention.to_q", "attention.to_k", "attention.to_v", "attention.to_out.0",
    "feed_forward.w1", "feed_forward.w2", "feed_forward.w3",
)


def pipeline_time(t: torch.Tensor) -> torch.Tensor:
    """``[B]`` sigmas -> the transformer's time as the pipeline computes it from its float32 timesteps ``1000 *
    sigma``: ``(1000 - timestep) / 1000``, which is not always bitwise ``1 - sigma``."""
    return (1000 - t.float() * 1000) / 1000


@dataclass
class ZImageSettings(FamilyConfig):
    """``actor.model.zimage`` (Z-Image / Z-Image-Turbo): 1024^2 and 512 text tokens as ZImagePipeline; LoRA r32 as
    DiffSynth-Studio (the shared default)."""

    resolution: Any = 1024
    max_sequence_length: int = 512


class ZImageFlowModel(FlowModel):
    """Z-Image behind :class:`~rlrunner.models.base.FlowModel`.

    Conditioning: ``prompt_embeds [B, L, D]`` (model dtype) and ``prompt_mask [B, L]`` (int64, 1 = token; ``L`` =
    the batch's longest prompt, at most ``max_sequence_length``). Latents: ``[B, 16, H/8, W/8]``.
    """

    model_type = "zimage"
    settings_type = ZImageSettings
    own_settings = ("cfg_truncation", "cfg_normalization")
    pipeline_class_name = "ZImagePipeline"
    lora_loader_class_name = "ZImageLoraLoaderMixin"
    vae_class_name = "AutoencoderKL"
    lora_target_modules = ZIMAGE_LORA_TARGETS
    # cfg: Z-Image (base); none: Z-Image-Turbo. Nothing in a folder's configs tells the two apart for certain (their
    # schedulers' shifts differ, but a fine-tune may change that), so auto is cfg; at guidance_scale 1 that is one
    # pass, the same as none, and the Turbo recipe says none
    guidance_kinds = ("cfg", "none")
    # the pipeline's guidance_scale g is rlrunner's s - 1 (module docstring); cfg_normalization may scale it down
    guidance_combine = "pos + (s - 1) (pos - neg)"

    @classmethod
    def sample_shapes(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> SampleShapes:
        """Latent ``(in_channels, H/f, W/f)`` with ``f = 2^(len(block_out_channels) - 1)``, in 2x2 patches for the
        transformer; ``prompt_embeds`` at most ``max_sequence_length`` tokens of the transformer's ``cap_feat_dim``."""
        height, width = resolution_hw(family_cfg.resolution)
        vae, transformer = configs["vae"], configs["transformer"]
        factor = 2 ** (len(vae["block_out_channels"]) - 1)
        check_divisible(height, width, factor * 2, "zimage")
        latent = (int(transformer.get("in_channels", 16)), height // factor, width // factor)
        text_tokens = int(family_cfg.max_sequence_length)
        cond = {"prompt_embeds": ((text_tokens, int(transformer.get("cap_feat_dim", 2560))), None),
                "prompt_mask": ((text_tokens,), torch.int64)}
        return SampleShapes(latent, cond, pixels=(height, width, 3), text_tokens=text_tokens,
                            image_tokens=(latent[1] // 2) * (latent[2] // 2))

    def schedule_kwargs(self, num_steps: int) -> dict[str, Any]:
        """The pipeline's ``set_timesteps`` arguments: its default sigmas and the token-count ``mu`` (used only by a
        scheduler config with dynamic shifting; the published ones shift statically)."""
        from diffusers.pipelines.z_image.pipeline_z_image import get_default_z_image_sigmas

        return {"sigmas": get_default_z_image_sigmas(num_steps),
                "mu": token_shift_mu(dict(self.pipe.scheduler.config), self.shapes.image_tokens)}

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """``{"prompt_embeds": [B, L, D] (model dtype), "prompt_mask": [B, L] int64}``."""
        with self.text_encoders_on_device():
            embeds, _ = self.pipe.encode_prompt(prompt=list(prompts), device=self.device,
                                                do_classifier_free_guidance=False,
                                                max_sequence_length=int(self.cfg.max_sequence_length))
        stacked, mask = stack_ragged(embeds)
        return {"prompt_embeds": stacked.to(self.dtype), "prompt_mask": mask}

    def concat_cond(self, conds: list[Cond]) -> Cond:
        """Concatenate along the batch, zero-padding embeddings and masks to the longest text."""
        return concat_padded(conds)

    def _predict_velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: Cond,
                          guidance: torch.Tensor | None = None) -> torch.Tensor:
        """latents ``[B, C, h, w]``, t ``[B]`` sigmas -> v ``[B, C, h, w]``: the negated transformer output."""
        out = self.transformer(
            list(latents.to(self.dtype).unsqueeze(2).unbind(0)),
            pipeline_time(t),
            unstack_ragged(cond["prompt_embeds"], cond["prompt_mask"]),
            return_dict=False,
        )[0]
        return -torch.stack(out).squeeze(2)

    def guided_velocity_fn(self, cond: Cond, guidance_scale: float = 1.0,
                           negative_cond: Cond | None = None) -> VelocityFn:
        """As :meth:`FlowModel.guided_velocity_fn`, and with ``cfg_truncation`` < 1 the pipeline's truncation: steps
        whose ``1 - sigma`` exceeds it run one unguided pass."""
        guided = super().guided_velocity_fn(cond, guidance_scale, negative_cond)
        truncation = float(self.cfg.cfg_truncation)
        if self.guidance != "cfg" or guidance_scale <= 1.0 or truncation >= 1.0:
            return guided
        plain = super().guided_velocity_fn(cond)

        def velocity_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            truncated = pipeline_time(t) > truncation
            if bool(truncated.all()):
                return plain(x, t).float()
            if not bool(truncated.any()):
                return guided(x, t)
            keep = truncated.view(-1, *[1] * (x.dim() - 1))
            return torch.where(keep, plain(x, t).float(), guided(x, t))

        return velocity_fn

    def combine_guidance(self, v_neg: torch.Tensor, v_cond: torch.Tensor, guidance_scale: float) -> torch.Tensor:
        """The pipeline's rule on ``[B, C, h, w]`` halves, in float32: ``pos + g (pos - neg)`` with ``g = s - 1``,
        each sample scaled down to ``cfg_normalization`` times ``pos``'s norm when it exceeds that (0 = off). The
        pipeline combines the raw outputs, whose negation is our velocity: the rule commutes with the sign."""
        pos, neg = v_cond.float(), v_neg.float()
        guided = pos + (guidance_scale - 1.0) * (pos - neg)
        limit = float(self.cfg.cfg_normalization)
        if limit > 0.0:
            pos_norm = torch.linalg.vector_norm(pos.flatten(1), dim=1)
            guided_norm = torch.linalg.vector_norm(guided.flatten(1), dim=1)
            max_norm = pos_norm * limit
            scale = torch.where(guided_norm > max_norm, max_norm / guided_norm, torch.ones_like(guided_norm))
            guided = guided * scale.view(-1, *[1] * (guided.dim() - 1))
        return guided

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """latents ``[B, C, h, w]`` -> uint8 ``[B, H, W, 3]``, decoded in float32."""
        images = []
        with self.vae_on_device() as vae:
            scale, shift = vae.config.scaling_factor, vae.config.shift_factor
            for part in latents.split(self.decode_batch_size):
                z = part.to(self.device, torch.float32) / scale + shift
                images.append(to_uint8(vae.decode(z, return_dict=False)[0]))
        return np.concatenate(images)
