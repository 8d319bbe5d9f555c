"""``tiny``: a CPU-sized grayscale pixel-space flow model that renders short strings (no GPU, no downloads).

It exists so that a laptop or CI can watch DiffusionNFT really learn: the shipped weights
(``examples/diffusion/models/tiny-ocr-flow``, made by ``scripts/pretrain_tiny.py``) draw 3-6 digit strings at
32x96 well above the OCR reward's chance level but far from perfect. Everything else is the same code path as
SD3 / Wan: the :class:`~rlrunner.models.base.FlowModel` interface, the ``default`` / ``ema`` LoRA adapters,
the shared samplers and LoRA checkpoints.

* latents are pixels: ``[B, 1, 32, 96]`` in [-1, 1] (no VAE); :meth:`TinyFlowModel.decode` gives
  ``[B, 32, 96, 3]`` uint8 (the grey channel repeated).
* conditioning is the prompt's first double-quoted span, one embedding per character slot
  (:class:`~rlrunner.models.tiny_text.CharTextEncoder`, frozen): ``cond["text_emb"]: [B, L, D]``.
* the denoiser is a diffusers ``UNet2DConditionModel`` on 4x4 pixel-unshuffled cells plus coordinate and
  slot channels (see :mod:`rlrunner.models.tiny_text`); LoRA goes on its attention, feed-forward and ResNet
  convolutions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlrunner.models.base import Cond, FlowModel
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.shapes import SampleShapes
from rlrunner.models.tiny_text import load_tiny_components, target_text, tiny_velocity


def _resolution(value: Any) -> tuple[int, int]:
    """``resolution`` as ``(height, width)``: an int (square) or a 2-element list."""
    if isinstance(value, int):
        return value, value
    values = [int(v) for v in value]
    if len(values) != 2:
        raise ValueError(f"actor.model.tiny.resolution must be an int or [height, width], got {list(value)}")
    return values[0], values[1]


@dataclass
class TinySettings(FamilyConfig):
    """``actor.model.tiny``: the shipped 32x96 model, 10 Euler steps on the plain grid, LoRA 16/16, 8 characters."""

    resolution: Any = field(default_factory=lambda: [32, 96])
    num_steps: int = 10
    eval_num_steps: int = 10
    train_sampler: str = "euler"
    shift: Any = 1.0
    lora_rank: int = 16
    lora_alpha: int = 16
    max_sequence_length: int = 8


class TinyFlowModel(FlowModel):
    """The tiny family behind :class:`FlowModel` (see the module docstring).

    Build with :meth:`load`. ``self.transformer`` is the UNet (the base class's name for the denoiser),
    ``self.text_encoders["text_encoder"]`` the frozen character encoder, ``self.alphabet`` the characters it was
    trained on (pass it as the OCR reward's ``alphabet`` filter).
    """

    model_type = "tiny"
    settings_type = TinySettings
    pipeline_class_name = "StableDiffusionPipeline"
    lora_loader_class_name = "StableDiffusionLoraLoaderMixin"
    lora_component = "unet"
    lora_target_modules = ("to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj", "ff.net.2",
                           "conv1", "conv2")

    def __init__(self, family_cfg: Any, unet: torch.nn.Module, text_encoder: torch.nn.Module | dict[str, Any],
                 index: dict[str, Any], *, device: torch.device, dtype: torch.dtype) -> None:
        """``text_encoder``: the module, or only its config (a denoiser-only model, which cannot encode)."""
        super().__init__(family_cfg, device=device, dtype=dtype)
        self.transformer = unet.to(device)
        if isinstance(text_encoder, torch.nn.Module):
            self.text_encoders = {"text_encoder": text_encoder.to(device).eval().requires_grad_(False)}
        text_config = dict(text_encoder.config) if isinstance(text_encoder, torch.nn.Module) else text_encoder
        self.index = index
        self.alphabet: str = str(index.get("alphabet", text_config["alphabet"]))
        self._resolution = _resolution(index["resolution"])
        self.shapes = self.sample_shapes(family_cfg, {"model_index": index, "text_encoder": text_config})

    @classmethod
    def check_model_index(cls, index: dict[str, Any], where: str) -> None:
        """A folder written by ``scripts/pretrain_tiny.py`` (its index names the family, not a diffusers pipeline)."""
        if index.get("_rlrunner_family") != cls.model_type:
            raise ValueError(f"{where} holds a {index.get('_class_name', 'unknown')} pipeline, not the tiny model "
                             f"that scripts/pretrain_tiny.py writes; fix model_type (or use auto) or the path")

    @classmethod
    def load(cls, model_path: str, family_cfg: Any, *, device: torch.device, dtype: torch.dtype,
             denoiser_only: bool = False) -> TinyFlowModel:
        """Load the folder written by ``scripts/pretrain_tiny.py`` and add the LoRA adapters.

        Args:
            model_path: folder with ``model_index.json``, ``unet/`` and ``text_encoder/``.
            family_cfg: ``actor.model.tiny`` (``resolution`` must be the trained one, default [32, 96];
                ``use_lora``, ``lora_rank``, ``lora_alpha``, ``lora_path``, ``shift``, ``gradient_checkpointing``).
            device, dtype: where and in which precision the denoiser runs.
            denoiser_only: leave the text encoder's weights unread (the actor's model, which never encodes).
        Raises:
            FileNotFoundError: ``model_path`` (or a part of it, or ``lora_path``) is missing.
            ValueError: the requested resolution differs from the trained one.
        """
        unet, text_encoder, index = load_tiny_components(str(model_path), dtype=dtype, text_encoder=not denoiser_only)
        model = cls(family_cfg, unet, text_encoder, index, device=device, dtype=dtype)
        wanted = _resolution(family_cfg.resolution)
        if wanted != model._resolution:
            raise ValueError(f"actor.model.tiny.resolution={list(wanted)} but the tiny model at {model_path!r} was "
                             f"trained at {list(model._resolution)}; set resolution: {list(model._resolution)}")
        if getattr(family_cfg, "gradient_checkpointing", False):
            model.transformer.enable_gradient_checkpointing()
        if getattr(family_cfg, "use_lora", True):
            model._add_lora_adapters(int(family_cfg.lora_rank), int(family_cfg.lora_alpha))
            if getattr(family_cfg, "lora_path", ""):
                model.load_lora(str(family_cfg.lora_path))
        else:
            model.transformer.requires_grad_(True)
        return model

    # ------------------------------------------------------------------ FlowModel
    @classmethod
    def sample_shapes(cls, family_cfg: Any, configs: dict[str, dict[str, Any]]) -> SampleShapes:
        """Shapes from ``model_index.json`` (the trained resolution and patch size) and the text encoder's config.

        Latent = pixels ``(1, H, W)``; ``text_emb``: ``max_length`` slots, ``dim`` wide; the UNet sees
        ``(H/p)(W/p)`` cells.
        """
        index, text_encoder = configs["model_index"], configs["text_encoder"]
        height, width = _resolution(index["resolution"])
        patch = int(index["patch_size"])
        slots = int(text_encoder["max_length"])
        return SampleShapes((1, height, width), {"text_emb": ((slots, int(text_encoder["dim"])), None)},
                            pixels=(height, width, 3), image_tokens=(height // patch) * (width // patch),
                            text_tokens=slots)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> Cond:
        """``{"text_emb": [B, L, D]}`` in the model dtype: slot embeddings of each prompt's quoted text."""
        if isinstance(prompts, str):
            raise TypeError("encode_prompts takes a list of prompts, got a single string")
        with self.text_encoders_on_device():
            emb = self.text_encoders["text_encoder"].encode(list(prompts))
        return {"text_emb": emb.to(self.device, self.dtype)}

    def _predict_velocity(self, latents: torch.Tensor, t: torch.Tensor, cond: Cond,
                          guidance: torch.Tensor | None = None) -> torch.Tensor:
        """latents ``[B, 1, H, W]``, t ``[B]`` sigmas in [0, 1] -> velocity ``[B, 1, H, W]``."""
        return tiny_velocity(self.transformer, latents.to(self.dtype), t.to(latents.device), cond["text_emb"])

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> np.ndarray:
        """Pixels ``[B, 1, H, W]`` in [-1, 1] -> uint8 ``[B, H, W, 3]`` (grey repeated to RGB)."""
        if latents.ndim != 4 or latents.shape[1] != 1:
            raise ValueError(f"tiny latents must be [B, 1, H, W], got {tuple(latents.shape)}")
        pixels = ((latents[:, 0].float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu().numpy()
        return np.repeat(pixels[..., None], 3, axis=-1)

    # ------------------------------------------------------------------ helpers
    def targets(self, prompts: list[str]) -> list[str]:
        """The strings the model is asked to draw (first quoted span, spaces removed)."""
        return [target_text(p) for p in prompts]
