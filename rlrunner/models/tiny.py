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
from rlrunner.models.build import folder_configs
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.shapes import ActivationProfile, SampleShapes
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


@dataclass
class TinyPipeline:
    """A tiny model folder held as a diffusers pipeline is, for the build hooks (:mod:`rlrunner.models.build`): the
    UNet as ``transformer``, the character encoder (``None``: not loaded, its config in ``skipped_configs``), no VAE,
    ``config`` = ``model_index.json``."""

    path: str
    config: dict[str, Any]
    transformer: torch.nn.Module
    text_encoder: torch.nn.Module | None
    skipped_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    vae: None = None

    @property
    def components(self) -> dict[str, torch.nn.Module | None]:
        return {"transformer": self.transformer, "text_encoder": self.text_encoder}


class TinyFlowModel(FlowModel):
    """The tiny family behind :class:`FlowModel` (see the module docstring).

    Build with :meth:`load`. ``self.transformer`` is the UNet (the base class's name for the denoiser),
    ``self.text_encoders["text_encoder"]`` the frozen character encoder, ``self.alphabet`` the characters it was
    trained on (pass it as the OCR reward's ``alphabet`` filter).
    """

    model_type = "tiny"
    activation_profile = ActivationProfile(decode=0.0)  # pixel-space latents: decoding is a cast, there is no VAE
    settings_type = TinySettings
    pipeline_class_name = "StableDiffusionPipeline"
    lora_loader_class_name = "StableDiffusionLoraLoaderMixin"
    lora_component = "unet"
    lora_target_modules = ("to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj", "ff.net.2",
                           "conv1", "conv2")

    # scripts/pretrain_tiny.py trains the whole UNet; use_lora: false keeps doing so
    full_finetune_without_lora = True

    @classmethod
    def check_model_index(cls, index: dict[str, Any], where: str) -> None:
        """A folder written by ``scripts/pretrain_tiny.py`` (its index names the family, not a diffusers pipeline)."""
        if index.get("_rlrunner_family") != cls.model_type:
            raise ValueError(f"{where} holds a {index.get('_class_name', 'unknown')} pipeline, not the tiny model "
                             f"that scripts/pretrain_tiny.py writes; fix model_type (or use auto) or the path")

    @classmethod
    def load_pipeline(cls, model_path: str, dtype: torch.dtype, denoiser_only: bool) -> TinyPipeline:
        """Build step 1: the folder written by ``scripts/pretrain_tiny.py`` (``model_index.json``, ``unet/``,
        ``text_encoder/``); ``denoiser_only`` leaves the text encoder's weights unread (the actor's model).

        Raises ``FileNotFoundError`` naming a missing folder or part.
        """
        unet, text_encoder, index = load_tiny_components(str(model_path), dtype=dtype, text_encoder=not denoiser_only)
        if isinstance(text_encoder, torch.nn.Module):
            return TinyPipeline(model_path, index, unet, text_encoder.eval())
        return TinyPipeline(model_path, index, unet, None, skipped_configs={"text_encoder": text_encoder})

    def check_pipeline(self, pipe: TinyPipeline) -> None:
        """The recipe's ``resolution`` is the one the model was trained at."""
        wanted, trained = _resolution(self.cfg.resolution), _resolution(pipe.config["resolution"])
        if wanted != trained:
            raise ValueError(f"actor.model.tiny.resolution={list(wanted)} but the tiny model at {pipe.path!r} was "
                             f"trained at {list(trained)}; set resolution: {list(trained)}")

    def configure(self, pipe: TinyPipeline) -> None:
        """The characters the text encoder was trained on (the OCR reward's ``alphabet`` filter)."""
        self.index = pipe.config
        text_config = folder_configs(pipe)["text_encoder"]
        self.alphabet: str = str(pipe.config.get("alphabet", text_config["alphabet"]))

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
