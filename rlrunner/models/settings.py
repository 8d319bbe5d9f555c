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
    num_steps: int = 10  # sampler steps of a training rollout
    eval_num_steps: int = 40  # sampler steps of an eval rollout
    # how guidance reaches the denoiser: cfg (two passes, combined by the family's rule) | embedded (guidance is a
    # model input, one pass: FLUX.1-dev) | none (guidance-distilled: FLUX.1-schnell, Z-Image-Turbo; guidance_scale
    # must be 1) | auto (the family's default for the loaded model); the family lists the kinds it supports
    guidance: str = "auto"
    guidance_scale: float = 1.0  # classifier-free guidance scale of training rollouts (1 = none; RLinf's cfg switch)
    eval_guidance_scale: float = 1.0  # guidance scale of eval rollouts
    # two-expert models (Wan2.2 A14B): the low-noise expert's scales (null: the same as guidance_scale /
    # eval_guidance_scale, as diffusers' WanPipeline); guidance is on only when the high-noise scale is > 1
    guidance_scale_2: Any = None
    # two-expert models: the low-noise expert's eval scale (null = eval_guidance_scale)
    eval_guidance_scale_2: Any = None
    # two-expert models: which experts get LoRA adapters and train: both | high (transformer, sigma >= boundary)
    # | low (transformer_2); an expert without adapters samples as the base model
    train_experts: str = "both"
    negative_prompt: str = ""  # the prompt of the unconditional pass of classifier-free guidance
    train_sampler: str = "dpm2"  # the sampler of training rollouts: euler | dpm2 (DPM-Solver++ 2M)
    eval_sampler: str = "euler"  # the sampler of eval rollouts: euler | dpm2
    # sampling schedule: null = the one the family's pipeline computes from the model folder's scheduler config
    # (static shift, or shifted by the image's token count: FLUX, Qwen-Image); a number = the plain shifted grid
    # shift*s / (1 + (shift - 1)*s) on linspace(1, 0, num_steps + 1), whatever the folder says
    shift: Any = None
    max_sequence_length: int = 256  # text tokens per prompt (longer prompts are cut)
    condition_mode: str = "t2v"  # Wan: what conditions a video: t2v (text only) is the one mode
    use_lora: bool = True  # train LoRA adapters (the only trained weights)
    lora_rank: int = 32  # LoRA rank r
    lora_alpha: int = 64  # LoRA alpha (the update is scaled by alpha / r)
    lora_path: str = ""  # a LoRA adapter (folder or .safetensors) to start from ("" = fresh adapters)
    # recompute activations in backward: less memory, slower (RLinf: actor.fsdp_config.gradient_checkpointing)
    gradient_checkpointing: bool = False
    # free the text encoders once the prompts are encoded (RLinf's offload_auxiliary_modules sets this and offload_vae)
    offload_text_encoder: bool = False
    offload_vae: bool = False  # move the VAE to host memory between decodes
    # zimage's guidance options, as ZImagePipeline's: no guidance on steps whose 1 - sigma exceeds cfg_truncation
    # (1.0 = guide every step); cfg_normalization > 0 scales each guided velocity down to at most that multiple of
    # the conditional one's norm (0 = off; the pipeline's cfg_normalization=True is 1.0)
    cfg_truncation: float = 1.0
    # zimage: cap each guided velocity at this multiple of the conditional one's norm (0 = off)
    cfg_normalization: float = 0.0
    # decode large frames in overlapping spatial tiles (Wan's VAE decodes frame by frame, so its memory follows
    # H x W; tiling bounds it)
    vae_tiling: bool = False
    vae_slicing: bool = False  # decode one video of a batch at a time

