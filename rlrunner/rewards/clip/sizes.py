"""Device bytes of a CLIP-family scorer from its config alone (``python -m rlrunner.commands.plan``): a local folder's
``config.json``, or the architecture of a known hub id (the defaults), built on the meta device; no weights read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .loading import is_local

_VIT_H_14 = {"text_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                             "num_attention_heads": 16, "hidden_act": "gelu"},
             "vision_config": {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
                               "num_attention_heads": 16, "patch_size": 14, "hidden_act": "gelu"},
             "projection_dim": 1024}
_VIT_L_14 = {"text_config": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                             "num_attention_heads": 12},
             "vision_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                               "num_attention_heads": 16, "patch_size": 14},
             "projection_dim": 768}
#: the hub ids the rewards default to (and HPS's open_clip ViT-H-14), as CLIPConfig arguments
KNOWN_ARCHITECTURES = {"yuvalkirstain/PickScore_v1": _VIT_H_14, "laion/CLIP-ViT-H-14-laion2B-s32B-b79K": _VIT_H_14,
                       "xswu/HPSv2": _VIT_H_14, "openai/clip-vit-large-patch14": _VIT_L_14}


def clip_config_dict(path: str) -> dict[str, Any] | None:
    """CLIPConfig arguments of ``path`` (a local folder's config.json, or a known hub id); None when unknown."""
    if is_local(path):
        config = Path(path).expanduser() / "config.json"
        return json.loads(config.read_text()) if config.is_file() else None
    return KNOWN_ARCHITECTURES.get(path)


def clip_bytes(config: Any, dtype: torch.dtype) -> tuple[int, int]:
    """``(bytes, parameters)`` of a ``CLIPModel`` with ``config`` (a CLIPConfig or its arguments) held in ``dtype``."""
    from transformers import CLIPConfig, CLIPModel

    from rlrunner.models.meta import module_bytes

    with torch.device("meta"):
        model = CLIPModel(config if isinstance(config, CLIPConfig) else CLIPConfig(**config))
    return module_bytes(model, dtype), sum(p.numel() for p in model.parameters())
