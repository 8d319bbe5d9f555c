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


def pipeline_configs(pipe: Any) -> dict[str, dict[str, Any]]:
    """Config dicts of a loaded pipeline's model components, keyed like ``model_index.json`` (those it was loaded
    without, read from their files: ``pipe.skipped_configs``)."""
    configs = dict(getattr(pipe, "skipped_configs", {}))
    for name, module in pipe.components.items():
        if isinstance(module, nn.Module):
            config = module.config
            configs[name] = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return configs
