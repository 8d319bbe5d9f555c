"""Per-sample tensor shapes of a model family, computed from its components' configs (no weights needed).

Each family's ``sample_shapes(family_cfg, configs)`` classmethod applies the same rules its pipeline applies
(VAE factors, patch sizes, text lengths) to plain config dicts, so a loaded model and the memory plan
(:mod:`rlrunner.commands.plan`) agree by construction: the families take their own ``latent_shape`` from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class SampleShapes:
    """Shapes of one sample (no batch axis).

    Attributes:
        latent: x0 / noise, e.g. ``(C, h, w)`` or ``(C, F', h, w)`` (float32 in rollouts and updates).
        cond: conditioning tensor name -> ``(shape, dtype)``; dtype ``None`` = the model dtype. Text lengths
            that depend on the prompt (Qwen-Image) are their upper bound ``max_sequence_length``.
        pixels: one decoded uint8 sample, ``(H, W, 3)`` or ``(F, H, W, 3)``.
        image_tokens: tokens (or cells) the denoiser sees per sample for the latent.
        text_tokens: text tokens per sample.
    """

    latent: tuple[int, ...]
    cond: dict[str, tuple[tuple[int, ...], torch.dtype | None]]
    pixels: tuple[int, ...]
    image_tokens: int
    text_tokens: int


@dataclass(frozen=True)
class ActivationProfile:
    """What a family's denoiser and VAE hold while they run, in the units the memory plan multiplies out
    (:func:`rlrunner.sizing.activations.activation_bytes`, :func:`~rlrunner.sizing.activations.decode_bytes`).

    A family declares the structure (``decode_chunk_frames``, ``text_in_sequence``); the constants are its
    full-size simulations' (``bin/rlrunner plan --simulate``, recorded in ``bench/simulated_recipes.json``), the
    largest over its shipped recipes, read from ``rlrunner/sizing/measured_activations.py``
    (:func:`rlrunner.sizing.memory.family_profile`). A family without a recorded recipe gets the defaults: the
    textbook block counts and the decode of diffusers' ``AutoencoderKL`` (SD3's and FLUX.1's VAE). Besides the
    block's own tensors the measured constants include peft's float32 LoRA path: the adapters are float32, so every
    adapted layer keeps a float32 copy of its input for backward and computes its LoRA output, scaled, in float32
    beside the base output (FLUX.2-klein's fused 27,648-wide projection: 3 times the bytes of the base output), and
    the sampler's constant the generate call's latents too (the formula counts them again: it stays above).

    Attributes:
        sampling: elements of the model dtype per token and hidden unit alive in one block at inference.
        training: elements per token and hidden unit the block being recomputed keeps for backward (gradient
            checkpointing; without it every block keeps this many). Korthikanti et al. 2022 give 17 with
            memory-efficient attention.
        decode: bytes per decoded pixel of one frame while the VAE decodes a chunk of ``decode_chunk_frames``.
        decode_chunk_frames: frames one VAE decode step produces at a time (a causal video VAE: 4 per latent
            frame); an image family 1.
        text_in_sequence: the text tokens join the blocks' sequence (joint attention: SD3, FLUX, Qwen-Image,
            Z-Image); False where they only feed cross-attention (Wan), so activations scale with image tokens.
    """

    sampling: float = 8.0
    training: float = 17.0
    decode: float = 3072.0
    decode_chunk_frames: int = 1
    text_in_sequence: bool = True


def pipeline_configs(pipe: Any) -> dict[str, dict[str, Any]]:
    """Config dicts of a loaded pipeline's model components, keyed like ``model_index.json`` (those it was loaded
    without, read from their files: ``pipe.skipped_configs``)."""
    configs = dict(getattr(pipe, "skipped_configs", {}))
    for name, module in pipe.components.items():
        if isinstance(module, nn.Module):
            config = module.config
            configs[name] = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return configs
