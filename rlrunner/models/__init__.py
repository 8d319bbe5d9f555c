"""Model families behind the :class:`~rlrunner.models.base.FlowModel` interface.

Which families exist is :mod:`rlrunner.models.families`: the in-tree ones, listed there, and those other packages
declare as entry points of group ``rlrunner.model_families`` (docs/families/index.md "A family or a reward from
your own package"). A family is a ``FlowModel`` subclass with a classmethod
``load(model_path, family_cfg, *, device, dtype)`` and a ``settings_type``, the dataclass of its recipe section
``actor.model.<model_type>`` (:mod:`rlrunner.models.settings`).

May import: rlrunner.algorithms, rlrunner.config, rlrunner.distributed, rlrunner.utils
"""

from __future__ import annotations

from typing import Any

from rlrunner.models.base import FlowModel
from rlrunner.models.families import BROKEN_FAMILIES, MODEL_FAMILIES, family_settings, model_class
from rlrunner.models.loading import read_model_index
from rlrunner.models.lora import ADAPTERS, EMA_ADAPTER, TRAINED_ADAPTER
from rlrunner.utils.device import resolve_device, resolve_dtype


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


def build_model(model_cfg: Any, denoiser_only: bool = False, denoiser_on_host: bool = False) -> FlowModel:
    """Load ``model_cfg.model_type`` from ``model_cfg.model_path`` with its family settings and LoRA adapters;
    ``denoiser_only``: without text encoders and VAE (the actor's model), which are then never read;
    ``denoiser_on_host``: the denoiser left in host memory, for FSDP2 to move to the device shard by shard
    (:func:`~rlrunner.distributed.parallelize.shards_from_host`; what the load holds where:
    :func:`~rlrunner.models.build.build_family`)."""
    family_cfg = model_cfg[model_cfg.model_type]
    device = resolve_device(model_cfg.device)
    dtype = resolve_dtype(model_cfg.precision, device, model_cfg.half_precision_on_cpu)
    return model_class(model_cfg.model_type).load(model_cfg.model_path, family_cfg, device=device, dtype=dtype,
                                                  denoiser_only=denoiser_only, denoiser_on_host=denoiser_on_host)


__all__ = ["ADAPTERS", "BROKEN_FAMILIES", "EMA_ADAPTER", "MODEL_FAMILIES", "TRAINED_ADAPTER", "FlowModel",
           "build_model", "detect_model_type", "family_settings", "model_class"]
