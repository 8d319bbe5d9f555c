"""Model families behind the :class:`~rlrunner.models.base.FlowModel` interface.

Families are imported lazily (SD3, Wan and Qwen-Image pull in large parts of transformers/diffusers).
To add one: write ``models/<family>.py`` with a ``FlowModel`` subclass that has a classmethod
``load(model_path, family_cfg, *, device, dtype)`` and list it in ``MODEL_FAMILIES``.

May import: rlrunner.algorithms, rlrunner.cluster, rlrunner.config, rlrunner.sizing, rlrunner.utils
"""

from __future__ import annotations

from typing import Any

from rlrunner.models.base import FlowModel
from rlrunner.models.loading import read_model_index
from rlrunner.models.lora import ADAPTERS, EMA_ADAPTER, TRAINED_ADAPTER
from rlrunner.utils.device import resolve_device, resolve_dtype
from rlrunner.utils.registry import lazy_class

MODEL_FAMILIES: dict[str, str] = {
    "tiny": "rlrunner.models.tiny:TinyFlowModel",
    "sd3": "rlrunner.models.sd3:SD3FlowModel",
    "wan22_ti2v_5b": "rlrunner.models.wan:WanFlowModel",
    "wan21_t2v": "rlrunner.models.wan:Wan21FlowModel",
    "wan22_t2v_a14b": "rlrunner.models.wan_a14b:WanA14BFlowModel",
    "qwen_image": "rlrunner.models.qwen_image:QwenImageFlowModel",
    "zimage": "rlrunner.models.zimage:ZImageFlowModel",
    "flux2_klein": "rlrunner.models.flux2_klein:Flux2KleinFlowModel",
    "flux1": "rlrunner.models.flux1:Flux1FlowModel",
}


def model_class(model_type: str) -> type[FlowModel]:
    return lazy_class(MODEL_FAMILIES, model_type, "actor.model.model_type")


def detect_model_type(model_path: str) -> str:
    """``model_type: auto``: the family whose :meth:`~FlowModel.matches_model_index` accepts the local folder's
    ``model_index.json`` (its pipeline ``_class_name``, and for Wan which variant). Raises ``ValueError`` naming the
    class when no family (or more than one) knows it, and for a hub id, whose index is not on this machine."""
    index = read_model_index(model_path)
    if index is None:
        raise ValueError(f"actor.model.model_type=auto reads model_index.json of a local folder, but "
                         f"actor.model.model_path={model_path!r} is a hub id; set model_type to one of "
                         f"{sorted(MODEL_FAMILIES)} or download the folder first")
    found = [name for name in MODEL_FAMILIES if model_class(name).matches_model_index(index)]
    if len(found) != 1:
        class_name = index.get("_class_name", "unknown")
        known = sorted({model_class(name).pipeline_class_name for name in MODEL_FAMILIES})
        what = "no family here knows it" if not found else f"several families accept it ({found})"
        raise ValueError(f"actor.model.model_path={model_path!r} holds a {class_name} pipeline and {what}; "
                         f"model_type auto knows {', '.join(known)} (families {sorted(MODEL_FAMILIES)})")
    return found[0]


def build_model(model_cfg: Any, denoiser_only: bool = False) -> FlowModel:
    """Load ``model_cfg.model_type`` from ``model_cfg.model_path`` with its family settings and LoRA adapters;
    ``denoiser_only``: without text encoders and VAE (the actor's model), which are then never read."""
    family_cfg = model_cfg[model_cfg.model_type]
    device = resolve_device(model_cfg.device)
    dtype = resolve_dtype(model_cfg.precision, device, model_cfg.half_precision_on_cpu)
    return model_class(model_cfg.model_type).load(model_cfg.model_path, family_cfg, device=device, dtype=dtype,
                                                  denoiser_only=denoiser_only)


__all__ = ["ADAPTERS", "EMA_ADAPTER", "MODEL_FAMILIES", "TRAINED_ADAPTER", "FlowModel", "build_model",
           "detect_model_type", "model_class"]
