"""The settings every model family reads (``actor.model.<model_type>``), the base of each family's own settings type.

A family names its type in :attr:`rlrunner.models.base.FlowModel.settings_type`: a dataclass that subclasses
:class:`FamilyConfig`, changing defaults (``TinySettings``: 32x96 pixels, LoRA 16/16) or adding keys of its own. The
recipe schema (:mod:`rlrunner.config.schema`) gives each family a section of that type, so the keys under
``actor.model.<model_type>`` are typed and an unknown one is an error naming it.

This module holds only dataclasses: a family's settings type imports from here (never from
``rlrunner.config.schema``, which imports the families to build its sections).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class FamilyConfig:
    """Settings of one model family (``actor.model.<model_type>``), with the defaults of a family that changes none."""

    resolution: Any = 512  # int (square) or [height, width]
    num_frames: int = 1  # video families: 4k + 1; 1 = image
    num_steps: int = 10
    eval_num_steps: int = 40
    # how guidance reaches the denoiser: cfg (two passes, combined by the family's rule) | embedded (guidance is a
    # model input, one pass: FLUX.1-dev) | none (guidance-distilled: FLUX.1-schnell, Z-Image-Turbo; guidance_scale
    # must be 1) | auto (the family's default for the loaded model); the family lists the kinds it supports
    guidance: str = "auto"
    guidance_scale: float = 1.0
    eval_guidance_scale: float = 1.0
    # two-expert models (Wan2.2 A14B): the low-noise expert's scales (null: the same as guidance_scale /
    # eval_guidance_scale, as diffusers' WanPipeline); guidance is on only when the high-noise scale is > 1
    guidance_scale_2: Any = None
    eval_guidance_scale_2: Any = None
    # two-expert models: which experts get LoRA adapters and train: both | high (transformer, sigma >= boundary)
    # | low (transformer_2); an expert without adapters samples as the base model
    train_experts: str = "both"
    negative_prompt: str = ""
    train_sampler: str = "dpm2"  # euler | dpm2
    eval_sampler: str = "euler"
    # sampling schedule: null = the one the family's pipeline computes from the model folder's scheduler config
    # (static shift, or shifted by the image's token count: FLUX, Qwen-Image); a number = the plain shifted grid
    # shift*s / (1 + (shift - 1)*s) on linspace(1, 0, num_steps + 1), whatever the folder says
    shift: Any = None
    max_sequence_length: int = 256
    condition_mode: str = "t2v"
    use_lora: bool = True
    lora_rank: int = 32
    lora_alpha: int = 64
    lora_path: str = ""
    gradient_checkpointing: bool = False
    # free text encoders after prompts are encoded and move the VAE to host memory between decodes
    offload_text_encoder: bool = False
    offload_vae: bool = False
    # zimage's guidance options, as ZImagePipeline's: no guidance on steps whose 1 - sigma exceeds cfg_truncation
    # (1.0 = guide every step); cfg_normalization > 0 scales each guided velocity down to at most that multiple of
    # the conditional one's norm (0 = off; the pipeline's cfg_normalization=True is 1.0)
    cfg_truncation: float = 1.0
    cfg_normalization: float = 0.0
    # decode large frames in overlapping spatial tiles (Wan's VAE decodes frame by frame, so its memory follows
    # H x W; tiling bounds it), and one video of a decode batch at a time
    vae_tiling: bool = False
    vae_slicing: bool = False

