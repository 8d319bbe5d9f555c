"""Pixel and latent geometry the families share: resolutions, patch checks, VAE latent statistics and decoding to
uint8 images."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn


def resolution_hw(resolution: Any) -> tuple[int, int]:
    """``512`` -> ``(512, 512)``; ``[704, 1280]`` -> ``(704, 1280)`` (height, width)."""
    if isinstance(resolution, int):
        return resolution, resolution
    values = list(resolution)
    if len(values) != 2 or not all(isinstance(v, int) for v in values):
        raise ValueError(f"resolution must be an int or [height, width], got {resolution!r}")
    return values[0], values[1]


def check_divisible(height: int, width: int, multiple: int, family: str) -> None:
    """Pixel sizes must map to whole latent patches."""
    if height % multiple or width % multiple:
        fix = [max(multiple, round(v / multiple) * multiple) for v in (height, width)]
        raise ValueError(f"{family} resolution {height}x{width} must be divisible by {multiple} "
                         f"(VAE factor x patch size); nearest valid: {fix[0]}x{fix[1]}")


def vae_latent_stats(vae: nn.Module, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel latent mean and std of a Wan-style VAE (Wan, Qwen-Image), shaped ``[1, C, 1, 1, 1]``."""
    shape = (1, vae.config.z_dim, 1, 1, 1)
    return (torch.tensor(vae.config.latents_mean, device=device).view(shape),
            torch.tensor(vae.config.latents_std, device=device).view(shape))


def to_uint8(pixels: torch.Tensor) -> np.ndarray:
    """VAE output in [-1, 1], channels at dim 1 -> uint8 with channels last (as diffusers' postprocess)."""
    pixels = (pixels.float() / 2 + 0.5).clamp(0, 1)
    return (pixels.movedim(1, -1) * 255).round().to(torch.uint8).cpu().numpy()


def decode_scaled_latents(vae: nn.Module, latents: torch.Tensor, device: torch.device, batch_size: int) -> np.ndarray:
    """``[B, C, h, w]`` latents of an ``AutoencoderKL`` family (SD3, FLUX.1) -> uint8 ``[B, H, W, 3]``: decoded as
    ``vae.decode(latents / scaling_factor + shift_factor)`` in float32, ``batch_size`` images per call."""
    scale, shift = vae.config.scaling_factor, vae.config.shift_factor or 0.0
    images = []
    for part in latents.split(batch_size):
        z = part.to(device, torch.float32) / scale + shift
        images.append(to_uint8(vae.decode(z, return_dict=False)[0]))
    return np.concatenate(images)
