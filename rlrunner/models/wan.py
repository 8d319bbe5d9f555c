"""Wan text-to-video with one transformer: WanTransformer3DModel + AutoencoderKLWan + UMT5.

Two folder layouts of ``diffusers.WanPipeline`` (told apart by :func:`wan_layout`; the two-expert Wan2.2 A14B is
:mod:`rlrunner.models.wan_a14b`, on the same code):

* ``wan22_ti2v_5b``: Wan2.2 TI2V-5B, ``expand_timesteps: true``, 48-channel VAE with 16x spatial compression;
* ``wan21_t2v``: Wan2.1 T2V 1.3B / 14B, one timestep per sample, 16-channel VAE with 8x spatial compression.

Mirrors ``diffusers.WanPipeline`` for text-to-video (``condition_mode: t2v``):

* ``num_frames`` = 4k + 1 (1 = a single image, decoded as ``[B, H, W, 3]``); latent frames
  ``1 + (num_frames - 1) / 4`` (4x temporal VAE); latent size ``H/s x W/s`` with the VAE's
  ``scale_factor_spatial`` s and ``z_dim`` channels.
* the transformer gets ``timestep = 1000 * sigma``, int64 (truncated) where the folder's scheduler is UniPC as
  the pipeline's loop passes it; with the pipeline config's ``expand_timesteps`` (Wan2.2
  TI2V) it is expanded to one timestep per patch token, ``[B, F * (h/2) * (w/2)]``, exactly as the pipeline
  builds it from its all-ones t2v mask.
* prompts are encoded by the pipeline's ``encode_prompt`` (UMT5, zero-padded to ``max_sequence_length``).
* decoding: ``vae.decode(latents * latents_std + latents_mean)`` in float32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlrunner.models.base import Cond, FlowModel
from rlrunner.models.pixels import check_divisible, resolution_hw, to_uint8, vae_latent_stats
from rlrunner.models.schedules import integer_timestep, pipeline_timestep_dtype
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.shapes import ActivationProfile, SampleShapes

CONDITION_MODES = ("t2v",)
#: what each Wan layout's model_index.json looks like, for the one-line errors
LAYOUTS = {
    "wan22_ti2v_5b": "Wan2.2 TI2V-5B (one transformer, expand_timesteps: true)",
    "wan21_t2v": "Wan2.1 T2V (one transformer, no expand_timesteps, no transformer_2)",
    "wan22_t2v_a14b": "Wan2.2 A14B (two experts: transformer_2 and boundary_ratio)",
}


def wan_layout(index: dict[str, Any]) -> str:
    """Which Wan family a WanPipeline ``model_index.json`` (or a loaded pipeline's config) is: a second expert
    (``transformer_2`` or ``boundary_ratio`` set) -> ``wan22_t2v_a14b``; ``expand_timesteps`` -> ``wan22_ti2v_5b``;
    else ``wan21_t2v``. Folders saved before diffusers knew these keys lack them: Wan2.1."""
    second = index.get("transformer_2")
    if (isinstance(second, (list, tuple)) and any(second)) or index.get("boundary_ratio") is not None:
        return "wan22_t2v_a14b"
    return "wan22_ti2v_5b" if index.get("expand_timesteps") else "wan21_t2v"


def latent_num_frames(num_frames: int, temporal_factor: int = 4) -> int:
    """Latent frames for ``num_frames`` pixel frames (4k + 1): ``1 + (num_frames - 1) / temporal_factor``."""
    if num_frames < 1 or (num_frames - 1) % temporal_factor:
        below = max(1, (num_frames - 1) // temporal_factor * temporal_factor + 1)
        raise ValueError(f"num_frames must be {temporal_factor}k + 1 (1 = image), got {num_frames}; nearest valid: "
                         f"{below} or {below + temporal_factor}")
    return 1 + (num_frames - 1) // temporal_factor


@dataclass
class WanSettings(FamilyConfig):
    """``actor.model.wan22_ti2v_5b``: 704x1280 and 512 text tokens, as WanPipeline."""

    resolution: Any = field(default_factory=lambda: [704, 1280])
    max_sequence_length: int = 512


@dataclass
class Wan21Settings(FamilyConfig):
    """``actor.model.wan21_t2v`` and ``wan22_t2v_a14b``: 480x832, 81 frames and 512 text tokens, as WanPipeline."""

    resolution: Any = field(default_factory=lambda: [480, 832])
    num_frames: int = 81
    max_sequence_length: int = 512


class WanFlowModel(FlowModel):
    """Wan2.2 TI2V-5B behind :class:`~rlrunner.models.base.FlowModel` (and the base of the other Wan layouts).

    Conditioning: ``prompt_embeds [B, max_sequence_length, 4096]``. Latents: ``[B, 48, F', H/16, W/16]``,
    ``F' = 1 + (num_frames - 1) / 4``.
    """

    model_type = "wan22_ti2v_5b"
    settings_type = WanSettings
    own_settings = ("condition_mode", "vae_tiling", "vae_slicing")
    pipeline_class_name = "WanPipeline"
    lora_loader_class_name = "WanLoraLoaderMixin"
    vae_class_name = "AutoencoderKLWan"
    # the reference code's targets: self- and cross-attention projections and the FFN
    lora_target_modules = (
        "attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
        "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0",
        "ffn.net.0.proj", "ffn.net.2",
    )
    decode_batch_size = 2
    #: the text only feeds cross-attention, and one latent frame decodes to a chunk of 4 frames (the constants:
    #: rlrunner/sizing/measured_activations.py)
    activation_profile = ActivationProfile(decode_chunk_frames=4, text_in_sequence=False)

    def check_pipeline(self, pipe: Any) -> None:
        """A condition mode we sample, and a pipeline of this layout (a hub id's index is checked only here)."""
        if self.cfg.condition_mode not in CONDITION_MODES:
            raise ValueError(f"{self.model_type} condition_mode {self.cfg.condition_mode!r} is not supported; "
                             f"valid: {list(CONDITION_MODES)}")
        self.check_model_index({**pipe.config, "_class_name": type(pipe).__name__}, "the loaded pipeline")

    def configure(self, pipe: Any) -> None:
        """VAE tiling / slicing (they bound the decode's memory at large frames) and the timestep layout."""
        if self.vae is not None:
            if self._option("vae_tiling"):
                self.vae.enable_tiling()
            if self._option("vae_slicing"):
                self.vae.enable_slicing()
        self.expand_timesteps = bool(pipe.config.expand_timesteps)
        # UniPC (the Wan folders' scheduler) hands the pipeline int64 timesteps, flow-matching Euler float32 ones
        self.integer_timesteps = pipeline_timestep_dtype(pipe.scheduler, self.schedule_kwargs(2)) == torch.int64
        self.num_frames = int(self.cfg.num_frames)
        self.patch_size = tuple(pipe.transformer.config.patch_size)

    @classmethod
    def check_model_index(cls, index: dict[str, Any], where: str) -> None:
        """A WanPipeline folder of this family's layout (:func:`wan_layout`), else one line naming both."""
        super().check_model_index(index, where)
        found = wan_layout(index)
        if found != cls.model_type:
            raise ValueError(f"{where} holds a {LAYOUTS[found]} WanPipeline, but model_type {cls.model_type!r} "
                             f"expects {LAYOUTS[cls.model_type]}; use model_type {found!r} (or auto)")

    @property
    def is_video(self) -> bool:
        """``num_frames: 1`` makes an image model: latents keep their frame axis, pixels do not."""
        return self.num_frames > 1

    @classmethod
    def sample_shapes(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> SampleShapes:
        """Shapes at ``family_cfg``'s settings from the component configs, by the pipeline's rules.

        Latent ``(C, F', H/s, W/s)`` with the VAE's ``scale_factor_spatial`` / ``scale_factor_temporal``;
        ``prompt_embeds``: ``max_sequence_length`` UMT5 tokens, ``text_dim`` wide; pixels ``(F, H, W, 3)``.
        """
        height, width = resolution_hw(family_cfg.resolution)
        transformer, vae = configs["transformer"], configs["vae"]
        spatial, patch = int(vae["scale_factor_spatial"]), tuple(transformer["patch_size"])
        num_frames = int(family_cfg.num_frames)
        frames = latent_num_frames(num_frames, int(vae["scale_factor_temporal"]))
        check_divisible(height, width, spatial * patch[1], cls.model_type)
        latent = (int(transformer["in_channels"]), frames, height // spatial, width // spatial)
        text_tokens = int(family_cfg.max_sequence_length)
        return SampleShapes(
            latent, {"prompt_embeds": ((text_tokens, int(transformer["text_dim"])), None)},
            pixels=(num_frames, height, width, 3) if num_frames > 1 else (height, width, 3), text_tokens=text_tokens,
            image_tokens=(frames // patch[0]) * (latent[2] // patch[1]) * (latent[3] // patch[2]),
        )

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """``{"prompt_embeds": [B, max_sequence_length, D]}`` in the model dtype (padding rows are zeros)."""
        with self.text_encoders_on_device():
            embeds, _ = self.pipe.encode_prompt(
                prompt=list(prompts), do_classifier_free_guidance=False,
                max_sequence_length=int(self.cfg.max_sequence_length), device=self.device,
            )
        return {"prompt_embeds": embeds.to(self.dtype)}

    def transformer_timestep(self, t: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """``[B]`` sigmas -> the transformer's timestep: ``[B]``, or ``[B, seq_len]`` with ``expand_timesteps``.

        ``1000 * sigma`` in the dtype of the folder's scheduler's timesteps: int64 (truncated) under UniPC, float32
        under flow-matching Euler. The pipeline builds the expanded form as ``(mask[0][0][:, ::p_h, ::p_w] *
        t).flatten()`` from an all-ones float32 t2v mask ``[B, C, F', h, w]``: float32 on each of the
        ``F' * (h / p_h) * (w / p_w)`` tokens.
        """
        timestep = integer_timestep(t) if self.integer_timesteps else t.float() * 1000
        if not self.expand_timesteps:
            return timestep
        timestep = timestep.float()  # float32 mask times the scheduler's timestep
        _, _, frames, height, width = latents.shape
        seq_len = frames * (height // self.patch_size[1]) * (width // self.patch_size[2])
        return timestep[:, None].expand(-1, seq_len)

    def _predict_velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: Cond,
                          guidance: torch.Tensor | None = None) -> torch.Tensor:
        """latents ``[B, C, F', h, w]``, t ``[B]`` sigmas -> v ``[B, C, F', h, w]`` (model dtype)."""
        return self.transformer(
            hidden_states=latents.to(self.dtype),
            timestep=self.transformer_timestep(t, latents),
            encoder_hidden_states=cond["prompt_embeds"],
            return_dict=False,
        )[0]

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """latents ``[B, C, F', h, w]`` -> uint8 frames ``[B, num_frames, H, W, 3]`` (``[B, H, W, 3]`` when
        ``num_frames`` is 1), decoded in float32."""
        videos = []
        with self.vae_on_device() as vae:
            mean, std = vae_latent_stats(vae, self.device)
            for part in latents.split(self.decode_batch_size):
                z = part.to(self.device, torch.float32) * std + mean
                video = vae.decode(z, return_dict=False)[0]  # [b, 3, F, H, W] in [-1, 1]
                videos.append(to_uint8(video))
        videos = np.concatenate(videos)
        return videos if self.is_video else videos[:, 0]


class Wan21FlowModel(WanFlowModel):
    """Wan2.1 T2V (1.3B / 14B) behind :class:`~rlrunner.models.base.FlowModel`: the TI2V-5B code without
    ``expand_timesteps`` (one timestep per sample, read from the folder). Latents ``[B, 16, F', H/8, W/8]``."""

    model_type = "wan21_t2v"
    settings_type = Wan21Settings
    #: no shipped recipe: measured by the A14B's, whose experts are Wan2.1-14B transformers with the Wan2.1 VAE
    activations_measured_by = "wan22_t2v_a14b"
