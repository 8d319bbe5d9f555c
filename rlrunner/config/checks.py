"""Running the per-key checks: walking a recipe's leaves, matching each leaf to its table entry, and running it.

The tables are the components' (``KEY_CHECKS`` in ``rlrunner/<component>/checks.py``, registered in
:mod:`rlrunner.recipe`), keyed by dotted key, with ``<split>`` standing for ``train``/``eval`` and
``<family>`` for each model family section (``actor.model.tiny``, ``actor.model.sd3``, ...).
tests/config/test_checks.py fails when a leaf of the schema has no entry in exactly one table, so a new key cannot
ship unchecked: add it to the table of the component that reads it, with the narrowest check that fits.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlrunner.config.check_kinds import Check, Context, Free


def _is_section(node: Any) -> bool:
    """A schema dataclass section (walked into), as opposed to a leaf such as a dict- or list-valued key."""
    return isinstance(node, DictConfig) and OmegaConf.get_type(node) not in (None, dict)


def leaves(cfg: DictConfig, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of a structured config, in schema order."""
    for key in cfg:
        node = cfg._get_node(key)
        dotted = f"{prefix}{key}"
        if _is_section(node):
            yield from leaves(cfg[key], f"{dotted}.")
        else:
            yield dotted, cfg[key]


def table_key(dotted: str, families: Iterable[str]) -> str:
    """The ``KEY_CHECKS`` entry of a dotted key: ``env.eval.reward.model`` -> ``env.<split>.reward.model``."""
    parts = dotted.split(".")
    if parts[0] == "env" and len(parts) > 2:
        parts[1] = "<split>"
    if parts[:2] == ["actor", "model"] and len(parts) > 3 and parts[2] in families:
        parts[2] = "<family>"
    return ".".join(parts)


def family_sections(cfg: DictConfig) -> list[str]:
    """The model family sections of ``actor.model`` (each of its family's settings type, a FamilyConfig)."""
    return [key for key in cfg.actor.model if _is_section(cfg.actor.model._get_node(key))]


#: a key that a family's settings type adds to the shared ones (a plugin's, rlrunner/models/settings.py)
FAMILY_OWN_KEY = Free("a family's own setting: the type its settings dataclass declares is the check")


def key_check(dotted: str, families: Iterable[str], key_checks: Mapping[str, Check]) -> Check:
    """The check of leaf ``dotted`` in ``key_checks``, or :data:`FAMILY_OWN_KEY` for a key that only a family's own
    settings type declares (whose author, not the table, knows its range)."""
    key = table_key(dotted, families)
    if key not in key_checks and key.startswith("actor.model.<family>."):
        return FAMILY_OWN_KEY
    return key_checks[key]


def problems(cfg: DictConfig, ctx: Context, key_checks: Mapping[str, Check]) -> Iterator[str]:
    """One line per bad key: the key, its value and what is allowed (``key_checks``: every component's table)."""
    families = family_sections(cfg)
    for dotted, value in leaves(cfg):
        check = key_check(dotted, families, key_checks)
        plain = OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value
        if (why := check.problem(plain, ctx)) is not None:
            yield f"{dotted}={plain!r} {why}"
