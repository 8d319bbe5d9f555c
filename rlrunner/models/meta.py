"""Build a diffusers model folder's modules on the meta device from their ``config.json`` files and count bytes.

Only ``model_index.json`` and each model component's ``<component>/config.json`` are read; weight files are
never opened, so a folder holding just those JSON files is enough. Byte counts follow what
``Pipeline.from_pretrained(..., dtype=...)`` would hold: parameters and buffers in the load dtype, except the
modules a library keeps in float32 (diffusers' ``_keep_in_fp32_modules`` at any half dtype, transformers'
``_keep_in_fp32_modules`` at fp16 and ``_keep_in_fp32_modules_strict`` at fp16 and bf16).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

MODEL_INDEX = "model_index.json"
CONFIG_FILE = "config.json"
#: libraries whose classes model_index.json may name here (importing a class is how diffusers resolves them too)
KNOWN_LIBRARIES = ("diffusers", "transformers")
RLRUNNER_MODELS = "rlrunner.models."


class ModelFolderError(FileNotFoundError):
    """A model folder (or one of its config files) is missing or unreadable; the message names the path."""


@dataclass(frozen=True)
class Component:
    """One model component of a pipeline folder: its name, class and parsed ``config.json``."""

    name: str
    cls: type[nn.Module]
    config: dict[str, Any]
    folder: Path


def read_config_file(path: Path, what: str) -> dict[str, Any]:
    """A model folder's JSON file (``model_index.json``, a component's ``config.json``): the one reader of them;
    missing (``what`` says why it is needed) or unreadable, a :class:`ModelFolderError` naming the path."""
    if not path.is_file():
        raise ModelFolderError(f"{path} is missing: {what}")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ModelFolderError(f"{path} cannot be read as JSON ({str(err).splitlines()[0]})") from None


def _import_class(library: str, class_name: str, where: str) -> type:
    if library not in KNOWN_LIBRARIES and not library.startswith(RLRUNNER_MODELS):
        raise ModelFolderError(f"{where} names library {library!r}; only diffusers, transformers and rlrunner.models "
                               f"classes are built here")
    try:
        return getattr(importlib.import_module(library), class_name)
    except (ImportError, AttributeError) as err:
        raise ModelFolderError(f"{where} names {library}.{class_name}, which this environment cannot import "
                               f"({err})") from None


def _is_model_component(folder: Path, name: str, entry: list[str]) -> type | None:
    """The entry's class if it is an ``nn.Module``; None for schedulers, tokenizers and processors.

    A class that does not import counts as a model only when its folder has a ``config.json`` (tokenizers and
    schedulers keep their settings in other files), so a tokenizer this environment lacks is no error.
    """
    try:
        cls = _import_class(entry[0], entry[1], f"{folder / MODEL_INDEX} entry {name!r}")
    except ModelFolderError:
        if (folder / name / CONFIG_FILE).is_file():
            raise
        return None
    return cls if isinstance(cls, type) and issubclass(cls, nn.Module) else None


def read_components(folder: str | Path) -> tuple[dict[str, Any], dict[str, Component]]:
    """``model_index.json`` and the folder's model components (``nn.Module`` classes) with their configs.

    Schedulers, tokenizers and processors are skipped (they hold no device memory). Raises :class:`ModelFolderError` naming the missing folder or file.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFolderError(f"model folder {folder} does not exist; point actor.model.model_path at a local "
                               f"diffusers folder (model_index.json and each component's config.json suffice)")
    index = read_config_file(folder / MODEL_INDEX, "a diffusers model folder has one (the pipeline's component list)")
    components: dict[str, Component] = {}
    for name, entry in index.items():
        if name.startswith("_") or not (isinstance(entry, list) and len(entry) == 2
                                        and all(isinstance(part, str) for part in entry)):
            continue  # settings, and [null, null] for an absent component
        cls = _is_model_component(folder, name, entry)
        if cls is None:
            continue
        config = read_config_file(folder / name / CONFIG_FILE, f"{name} is listed in {MODEL_INDEX} as {entry[1]}")
        components[name] = Component(name, cls, config, folder / name)
    return index, components


def _is_transformers_model(cls: type) -> bool:
    return hasattr(cls, "config_class") and hasattr(cls, "_from_config")


def build_on_meta(component: Component, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The component's module with every parameter and buffer on the meta device (no memory, no weights).

    transformers models are built under ``dtype`` as the default dtype, as their ``from_pretrained`` does, so
    that buffers computed in float32 on purpose (rotary ``inv_freq``) keep it.
    """
    default = torch.get_default_dtype()
    with torch.device("meta"):
        if not _is_transformers_model(component.cls):
            return component.cls.from_config(component.config)  # diffusers (and rlrunner's ConfigMixin models)
        torch.set_default_dtype(dtype)
        try:
            return component.cls._from_config(component.cls.config_class.from_dict(component.config))
        finally:
            torch.set_default_dtype(default)


def _fp32_module_names(module: nn.Module, dtype: torch.dtype) -> set[str]:
    """Sub-module names the library keeps in float32 when loading in ``dtype`` (see the module docstring)."""
    if dtype == torch.float32:
        return set()
    if hasattr(module, "_keep_in_fp32_modules_strict"):  # transformers' PreTrainedModel
        names = set(module._keep_in_fp32_modules_strict or ())
        return names | set(module._keep_in_fp32_modules or ()) if dtype == torch.float16 else names
    return set(getattr(module, "_keep_in_fp32_modules", None) or ())


def module_bytes(module: nn.Module, dtype: torch.dtype) -> int:
    """Bytes of ``module``'s parameters and buffers when loaded in ``dtype``.

    ``module`` comes from :func:`build_on_meta` with the same ``dtype``. Floating parameters (and diffusers'
    buffers) take ``dtype`` unless kept in float32; transformers' buffers keep the dtype they were built in.
    """
    keep_fp32 = _fp32_module_names(module, dtype)
    own_buffer_dtype = _is_transformers_model(type(module))
    total = 0
    for kind, named in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
        for name, tensor in named:
            if not tensor.is_floating_point() or (kind == "buffer" and own_buffer_dtype):
                total += tensor.numel() * tensor.element_size()
            else:
                stored = torch.float32 if keep_fp32 & set(name.split(".")) else dtype
                total += tensor.numel() * stored.itemsize
    return total


def lora_parameter_count(denoiser: nn.Module, target_modules: tuple[str, ...], rank: int, alpha: int,
                         exclude_modules: tuple[str, ...] = ()) -> int:
    """Parameters of one LoRA adapter on ``denoiser`` (a meta module; modified in place).

    The adapter is added with the same config as :class:`~rlrunner.models.lora.LoraAdapters` (diffusers'
    ``add_adapter`` with :func:`~rlrunner.models.lora.lora_config` on the family's targets and exclusions), so the
    count is peft's.
    """
    from rlrunner.models.lora import lora_config

    config = lora_config(target_modules, rank, alpha, exclude_modules=exclude_modules)
    with torch.device("meta"):
        denoiser.add_adapter(config, adapter_name="default")
    return sum(p.numel() for n, p in denoiser.named_parameters() if ".default." in n)
