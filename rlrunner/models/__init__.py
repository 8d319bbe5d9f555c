"""Model families behind the :class:`~rlrunner.models.base.FlowModel` interface.

Families are imported lazily (SD3, Wan and Qwen-Image pull in large parts of transformers/diffusers).
To add one: write ``models/<family>.py`` with a ``FlowModel`` subclass that has a classmethod
``load(model_path, family_cfg, *, device, dtype)`` and list it in ``MODEL_FAMILIES``.
"""

from __future__ import annotations

from typing import Any

from rlrunner.models.base import FlowModel
from rlrunner.models.lora import ADAPTERS, EMA_ADAPTER, TRAINED_ADAPTER
from rlrunner.utils.device import resolve_device, resolve_dtype
from rlrunner.utils.registry import lazy_class

MODEL_FAMILIES: dict[str, str] = {
    "tiny": "rlrunner.models.tiny:TinyFlowModel",
    "sd3": "rlrunner.models.sd3:SD3FlowModel",
    "wan22_ti2v_5b": "rlrunner.models.wan:WanFlowModel",
    "qwen_image": "rlrunner.models.qwen_image:QwenImageFlowModel",
}


def model_class(model_type: str) -> type[FlowModel]:
    return lazy_class(MODEL_FAMILIES, model_type, "actor.model.model_type")


def build_model(model_cfg: Any, denoiser_only: bool = False) -> FlowModel:
    """Load ``model_cfg.model_type`` from ``model_cfg.model_path`` with its family settings and LoRA adapters;
    ``denoiser_only``: without text encoders and VAE (the actor's model), which are then never read."""
    family_cfg = model_cfg[model_cfg.model_type]
    device = resolve_device(model_cfg.device)
    dtype = resolve_dtype(model_cfg.precision, device, model_cfg.half_precision_on_cpu)
    return model_class(model_cfg.model_type).load(model_cfg.model_path, family_cfg, device=device, dtype=dtype,
                                                  denoiser_only=denoiser_only)


__all__ = ["ADAPTERS", "EMA_ADAPTER", "MODEL_FAMILIES", "TRAINED_ADAPTER", "FlowModel", "build_model", "model_class"]
