"""Hydra-style ``defaults:`` composition, so that RLinf's recipes load as they are.

A recipe may start with a defaults list, as RLinf's ``examples/diffusion/config/*.yaml`` do::

    defaults:
      - env/ocr@env.train              # <group>/<option>[@<package>]: config_dir/env/ocr.yaml placed at env.train
      - model/sd3@actor.model
      - override hydra/job_logging: stdout
      - _self_                         # where the recipe's own keys go (default: last, so they win)

Options are looked up in the recipe's folder, then in the folders of ``hydra.searchpath`` (``file://`` entries,
``${oc.env:VAR}`` expanded; an entry whose variable is unset is skipped). ``hydra/...`` entries configure Hydra's
own launcher and are skipped; ``override <group>[@<package>]: <option>`` replaces the option of an earlier entry.
Interpolations (``${...}``, ``${oc.env:...}``) are left in place and resolved later, on the whole recipe.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf

from rlrunner.config.errors import RecipeError

SELF = "_self_"
_ENV = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^}]*))?\}")


@dataclass
class _Default:
    group: str  # "env" ("" for a plain config name)
    option: str  # "ocr"
    package: str  # "env.train" ("" = the root)


def load_yaml(path: Path) -> DictConfig:
    """One YAML mapping; a RecipeError names the file otherwise."""
    try:
        node = OmegaConf.load(path)
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(node, DictConfig):
        raise RecipeError(f"{path}: a recipe is a mapping of sections (cluster, runner, ...), got {type(node)}")
    return node


def _expand_env(text: str) -> str | None:
    """``file://${oc.env:REPO_PATH}/x`` with its variables set; None when one is unset and has no default."""
    missing = []

    def value(match: re.Match) -> str:
        got = os.environ.get(match.group(1), match.group(2))
        if got is None:
            missing.append(match.group(1))
        return got or ""

    expanded = _ENV.sub(value, text)
    return None if missing else expanded


def search_dirs(recipe: DictConfig, config_dir: Path) -> list[Path]:
    """The recipe's folder, then its ``hydra.searchpath`` folders that exist."""
    dirs = [config_dir]
    hydra = recipe.get("hydra")
    entries = OmegaConf.to_container(hydra, resolve=False).get("searchpath") if isinstance(hydra, DictConfig) else None
    for entry in entries or []:
        expanded = _expand_env(str(entry))
        if expanded is None:
            continue
        path = Path(expanded.removeprefix("file://")).expanduser()
        if path.is_dir() and path not in dirs:
            dirs.append(path)
    return dirs


def _parse_entry(entry: object, source: Path) -> tuple[bool, _Default | None]:
    """``(is_override, default)`` of one defaults entry; default None for ``_self_`` and ``hydra/...`` entries."""
    if isinstance(entry, str):
        if entry == SELF:
            return False, None
        head, _, package = entry.partition("@")
        group, _, option = head.rpartition("/")
        if group == "hydra" or group.startswith("hydra/"):
            return False, None
        return False, _Default(group, option, package or group.replace("/", "."))
    if isinstance(entry, dict) and len(entry) == 1:
        (key, option), = entry.items()
        override = key.startswith("override ")
        key = key.removeprefix("override ").removeprefix("optional ").strip()
        group, _, package = key.partition("@")
        if group == "hydra" or group.startswith("hydra/"):
            return override, None
        if option is None:  # `- group: null` removes the group
            return override, _Default(group, "", package)
        return override, _Default(group, str(option), package or group.replace("/", "."))
    raise RecipeError(f"{source}: defaults entry {entry!r} is not of the form 'group/option@package', "
                      f"'group@package: option', 'override group: option' or '_self_'")


def _find(default: _Default, dirs: list[Path], source: Path) -> Path:
    rel = Path(default.group) / f"{default.option}.yaml"
    for folder in dirs:
        if (folder / rel).is_file():
            return folder / rel
    raise RecipeError(f"{source}: defaults entry '{default.group}/{default.option}' needs {rel}, found in none of "
                      f"{[str(d) for d in dirs]}; copy it there (RLinf keeps hybrid_engines/ and weight_syncer/ in "
                      f"examples/embodiment/config/) or add its folder to hydra.searchpath")


def _placed(node: DictConfig, package: str) -> DictConfig:
    return node if not package else OmegaConf.create(_nest(package.split("."), node))


def _nest(parts: list[str], node: DictConfig) -> dict:
    return {parts[0]: node if len(parts) == 1 else _nest(parts[1:], node)}


def compose(path: Path, _depth: int = 0) -> DictConfig:
    """The recipe at ``path`` with its defaults list expanded (recursively) and merged in order."""
    if _depth > 16:
        raise RecipeError(f"{path}: defaults lists nest more than 16 deep (a cycle?)")
    recipe = load_yaml(path)
    entries = recipe.pop("defaults", None)
    if entries is None:
        return recipe
    if not isinstance(entries, ListConfig):
        raise RecipeError(f"{path}: 'defaults' is a list of entries such as '- env/ocr@env.train', got {entries!r}")
    dirs = search_dirs(recipe, path.parent)
    order: list[_Default | str] = []
    for entry in OmegaConf.to_container(entries):
        override, default = _parse_entry(entry, path)
        if default is None:
            if entry == SELF:
                order.append(SELF)
            continue
        if override:
            earlier = [d for d in order if isinstance(d, _Default) and d.group == default.group
                       and (not default.package or d.package == default.package)]
            if not earlier:
                raise RecipeError(f"{path}: 'override {default.group}' has no earlier '{default.group}/...' entry "
                                  f"to override; drop 'override ' to add it")
            for d in earlier:
                d.option = default.option
            continue
        order.append(default)
    if SELF not in order:
        order.append(SELF)  # Hydra >= 1.1: the recipe's own keys win over its defaults
    merged = OmegaConf.create({})
    for item in order:
        if item == SELF:
            layer = recipe
        elif not item.option:
            continue
        else:
            layer = _placed(compose(_find(item, dirs, path), _depth + 1), item.package)
        merged = OmegaConf.merge(merged, layer)
    return merged
