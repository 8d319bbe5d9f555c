"""Registries of classes named ``"module:Class"``, imported on first use (families and algorithms pull in large
libraries that a recipe may never need)."""

from __future__ import annotations

import importlib


def lazy_class(registry: dict[str, str], name: str, what: str) -> type:
    """The class that ``registry`` names for ``name``; an unknown name raises ValueError naming ``what``."""
    if name not in registry:
        raise ValueError(f"unknown {what} {name!r}; valid: {sorted(registry)}")
    module_name, class_name = registry[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)
