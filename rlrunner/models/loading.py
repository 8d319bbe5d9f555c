"""Loading a family's diffusers pipeline: the whole of it (rollout workers) or the denoiser alone (the actor), and the
parts a family model takes from it.

``model_path`` is a local diffusers pipeline folder or a hub id; errors name it. A denoiser-only pipeline is loaded
with its other components passed as ``None``, so their weights are never read, not even into host memory; their
``config.json`` files are, since the sample shapes depend on them (``pipe.skipped_configs``, read by
:func:`rlrunner.models.shapes.pipeline_configs`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlrunner.models.meta import MODEL_INDEX, read_config_file
from rlrunner.models.pixels import resolution_hw

#: the pipeline components a denoiser-only model (the actor's) loads (transformer_2: the second expert of a
#: two-expert model; absent elsewhere)
DENOISER_PARTS = ("transformer", "transformer_2", "scheduler")


def read_model_index(model_path: str) -> dict[str, Any] | None:
    """``model_index.json`` of a local diffusers folder (``None`` for a hub id, which is read when it is loaded).

    Raises ``ValueError`` (an empty path) or ``FileNotFoundError`` (a local path that does not exist; a folder whose
    ``model_index.json`` is missing or unreadable: :class:`~rlrunner.models.meta.ModelFolderError`), each naming
    the path.
    """
    if not model_path:
        raise ValueError("actor.model.model_path is empty; set it to a local diffusers folder or a hub id 'org/name'")
    path = Path(model_path).expanduser()
    if path.is_dir():
        return read_config_file(path / MODEL_INDEX, f"actor.model.model_path {model_path!r} is not a diffusers "
                                                    f"pipeline folder (save one with the pipeline's save_pretrained)")
    if model_path.startswith(("/", ".", "~")) or model_path.count("/") != 1 or path.exists():
        raise FileNotFoundError(f"actor.model.model_path {model_path!r} does not exist; expected a local diffusers "
                                f"folder with model_index.json or a hub id 'org/name'")
    return None


def check_model_path(model_path: str, family: Any) -> str:
    """Validate ``actor.model.model_path`` for ``family`` (a FlowModel class): a local diffusers folder whose
    ``model_index.json`` the family accepts (:meth:`~rlrunner.models.base.FlowModel.check_model_index`), or a hub
    id ``org/name``. Returns the path to load from."""
    index = read_model_index(model_path)
    if index is None:
        return model_path
    family.check_model_index(index, f"actor.model.model_path {model_path!r}")
    return str(Path(model_path).expanduser())


def load_pipeline(pipeline_cls: type, model_path: str, method: str = "from_pretrained", **kwargs: Any) -> Any:
    """``pipeline_cls.from_pretrained(model_path, **kwargs)`` (or its ``load_config``) with an error that names the
    path on failure."""
    try:
        return getattr(pipeline_cls, method)(model_path, **kwargs)
    except (OSError, ValueError) as err:
        where = "folder" if Path(model_path).expanduser().is_dir() else "hub id (no local folder of that name)"
        raise OSError(f"could not load {pipeline_cls.__name__} from {where} {model_path!r}: "
                      f"{str(err).splitlines()[0].rstrip('.')}. Without network access, download it first and point "
                      f"actor.model.model_path at the local folder") from err


def load_family_pipeline(family: Any, model_path: str, dtype: torch.dtype, denoiser_only: bool = False) -> Any:
    """The pipeline of ``family`` (a FlowModel class: its ``pipeline_class_name``, ``vae_class_name``,
    ``model_type``) from ``model_path``: the VAE in float32, the rest in ``dtype``; with ``denoiser_only``, only
    :data:`DENOISER_PARTS`."""
    import diffusers

    path = check_model_path(model_path, family)
    pipeline_cls = getattr(diffusers, family.pipeline_class_name)
    if not denoiser_only:
        vae = load_pipeline(getattr(diffusers, family.vae_class_name), path, subfolder="vae", dtype=torch.float32)
        return load_pipeline(pipeline_cls, path, vae=vae, dtype=dtype)
    index = load_pipeline(pipeline_cls, path, "load_config")
    # components are [library, class] entries; other keys (Wan's expand_timesteps, boundary_ratio) are the
    # pipeline's own settings and load as saved
    skipped = {name: None for name, entry in index.items()
               if not name.startswith("_") and isinstance(entry, (list, tuple)) and name not in DENOISER_PARTS}
    pipe = load_pipeline(pipeline_cls, path, dtype=dtype, **skipped)
    pipe.skipped_configs = skipped_component_configs(path, index, skipped)
    return pipe


def skipped_component_configs(model_path: str, index: dict[str, Any], names: Iterable[str]) -> dict[str, dict]:
    """``config.json`` of each model component among ``names`` (``model_index.json`` entries a pipeline was loaded
    without), as the loaded module's ``config.to_dict()`` would give it; tokenizers and processors have none."""
    from diffusers import ConfigMixin

    configs = {}
    for name in names:
        library, class_name = index[name] if isinstance(index[name], (list, tuple)) else (None, None)
        component_cls = getattr(importlib.import_module(library), class_name, None) if library else None
        if isinstance(component_cls, type) and issubclass(component_cls, ConfigMixin):  # diffusers models
            configs[name] = dict(component_cls.load_config(model_path, subfolder=name))
        elif isinstance(component_cls, type) and issubclass(component_cls, nn.Module):  # transformers models
            configs[name] = component_cls.config_class.from_pretrained(model_path, subfolder=name).to_dict()
    return configs


def hold_pipeline(model: Any, pipe: Any, transformer: nn.Module | None = None) -> None:
    """Give ``model`` (a FlowModel) ``pipe``, its denoiser (``transformer``, default ``pipe.transformer``), VAE, the
    text encoders its family names in ``text_encoder_names`` (those the folder has) and the pixel size of its
    ``resolution`` (build step 4, :mod:`rlrunner.models.build`)."""
    model.pipe = pipe
    model.transformer = pipe.transformer if transformer is None else transformer
    model.vae = pipe.vae
    model.text_encoders = {name: getattr(pipe, name) for name in model.text_encoder_names
                           if getattr(pipe, name, None) is not None}
    model.height, model.width = resolution_hw(model.cfg.resolution)
