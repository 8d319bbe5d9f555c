"""Load a recipe: YAML file → structured OmegaConf config with overrides (checked afterwards, by each component's
checks: :func:`rlrunner.recipe.load_recipe`).

Errors a user can fix are raised as :class:`RecipeError` with one line that names the key, the bad value and
what to change; the command-line entry point prints that line and exits non-zero without a traceback.
"""

from __future__ import annotations

import difflib
import logging
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from rlrunner.config.checks import family_sections
from rlrunner.config.compose import compose
from rlrunner.config.errors import RecipeError  # also imported from here by callers (it lived here before)
from rlrunner.config.paths import resolve_paths
from rlrunner.config.rlinf import translate

logger = logging.getLogger("rlrunner")
CONFIG_DIR = Path(__file__).resolve().parents[2] / "examples" / "diffusion" / "config"
DEFAULT_RECIPE = "tiny_awm_ocr"
# mappings that a recipe or override states whole: merging {"actor": "0-3", ...} into the default
# {"actor,env,rollout": "all"} would place every component twice
REPLACED_NOT_MERGED = ("cluster.component_placement",)


def available_recipes(config_dir: Path = CONFIG_DIR) -> list[str]:
    return sorted(p.stem for p in config_dir.glob("*.yaml"))


def recipe_path(name: str, config_dir: Path = CONFIG_DIR) -> Path:
    """The YAML of recipe ``name`` (a file stem in ``config_dir``, or a path to a .yaml file)."""
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return Path(name)
    path = config_dir / f"{name}.yaml"
    if not path.is_file():
        close = difflib.get_close_matches(name, available_recipes(config_dir), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RecipeError(f"no recipe named {name!r} in {config_dir}{hint}. "
                          f"Available recipes: {', '.join(available_recipes(config_dir)) or '(none)'}")
    return path


def _valid_keys(node: DictConfig, prefix: str) -> list[str]:
    return [f"{prefix}{key}" for key in node]


def _closest_key_hint(schema: DictConfig, full_key: str) -> str:
    """' (did you mean 'actor.optim.lr'?)' for a misspelt dotted key, else the valid keys at that level."""
    parts = full_key.split(".")
    node: Any = schema
    for depth, part in enumerate(parts):
        if isinstance(node, DictConfig) and part in node and not OmegaConf.is_missing(node, part):
            node = node[part]
            continue
        if not isinstance(node, DictConfig) or node._get_flag("struct") is False:
            return ""
        prefix = ".".join(parts[:depth]) + ("." if depth else "")
        candidates = _valid_keys(node, prefix)
        close = difflib.get_close_matches(prefix + part, candidates, n=1, cutoff=0.6)
        if close:
            return f" (did you mean {close[0]!r}?)"
        return f" (valid keys here: {', '.join(candidates)})"
    return ""


def _expected_type(schema: DictConfig, full_key: str) -> str:
    """The schema's declared type of ``full_key`` (e.g. ``int``, ``Optional[float]``)."""
    parent_key, _, leaf = full_key.rpartition(".")
    parent = OmegaConf.select(schema, parent_key) if parent_key else schema
    node = parent._get_node(leaf) if isinstance(parent, DictConfig) and leaf in parent else None
    ref = node._metadata.ref_type if node is not None else None
    return getattr(ref, "__name__", None) or str(ref).replace("typing.", "")


def _describe_omegaconf_error(err: OmegaConfBaseException, schema: DictConfig, source: str) -> RecipeError:
    key = getattr(err, "full_key", None) or ""
    if isinstance(err, ConfigKeyError) or "not in struct" in str(err) or "Key '" in str(err) and "not" in str(err):
        return RecipeError(f"{source}: unknown key {key!r}{_closest_key_hint(schema, key)}")
    if isinstance(err, ValidationError) and key:
        value = getattr(err, "value", None)
        return RecipeError(f"{source}: key {key!r} has value {value!r} of the wrong type; expected "
                           f"{_expected_type(schema, key)}")
    return RecipeError(" ".join(part for part in (f"{source}:", key, str(err).splitlines()[0]) if part))


def _without_hydra_prefix(item: str) -> str:
    """``+key=value`` / ``++key=value`` as ``key=value``: hydra's ``+`` adds a key the schema lacks and ``++`` sets a
    key whether or not it is there; every key of a recipe is in the struct schema (which names an unknown one), so
    both mean plain assignment here."""
    return item.removeprefix("++") if item.startswith("++") else item.removeprefix("+")


def parse_overrides(overrides: list[str]) -> DictConfig:
    """``["actor.optim.lr=1e-4", "algorithm.nft_tau=[1.0,0.01,0,70]"]`` → a nested config (hydra's
    ``+key=value`` and ``++key=value`` are ``key=value``)."""
    overrides = [_without_hydra_prefix(item) for item in overrides]
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise RecipeError(f"override {item!r} is not of the form dotted.key=value (e.g. actor.optim.lr=1e-4)")
    try:
        return OmegaConf.from_dotlist(overrides)
    except (OmegaConfBaseException, yaml.YAMLError) as err:  # values are read as YAML: '"', '[', control chars
        raise RecipeError(f"cannot parse overrides {overrides}: {str(err).splitlines()[0]}") from None


def merge_recipe(name: str, overrides: list[str] | None = None, config_dir: Path = CONFIG_DIR, *,
                 schema_type: type, check_datasets: bool = True) -> DictConfig:
    """Merge recipe ``name`` and ``overrides`` onto the schema ``schema_type`` (a structured config dataclass:
    :data:`rlrunner.recipe.RecipeConfig`, which holds the model families' sections) and resolve interpolations, not
    yet checked: :func:`rlrunner.recipe.load_recipe` checks it (each component its keys) and makes it read-only.

    ``check_datasets=False`` accepts a recipe whose prompt files are absent (for tools that read no prompts).
    Returns a struct-mode :class:`DictConfig` whose local paths are absolute (:mod:`rlrunner.config.paths`);
    raises :class:`RecipeError` on any user error.
    """
    path = recipe_path(name, config_dir)
    schema = OmegaConf.structured(schema_type)
    families = family_sections(schema)
    recipe, ignored = translate(compose(path), schema, families, source=str(path))
    override_layer, ignored_too = translate(parse_overrides(overrides or []), schema, families, under=recipe,
                                            source="command-line override")
    if ignored or ignored_too:
        logger.warning("rlrunner: RLinf keys accepted that change nothing here "
                       "(docs/migrating.md \"Coming from RLinf\"): %s",
                       ", ".join(dict.fromkeys(ignored + ignored_too)))
    cfg = schema
    for source, layer in ((str(path), recipe), ("command-line override", override_layer)):
        try:
            cfg = OmegaConf.merge(cfg, layer)
            for key in REPLACED_NOT_MERGED:
                value = OmegaConf.select(layer, key, default=None)
                if value is not None:
                    OmegaConf.update(cfg, key, value, merge=False)
        except OmegaConfBaseException as err:
            raise _describe_omegaconf_error(err, schema, source) from None
        except TypeError as err:  # OmegaConf's own, for a mapping merged onto a list or the reverse ('key=0:')
            raise RecipeError(f"{source}: {err}: a list key was given a mapping, or a mapping key a list") from None
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        raise RecipeError(f"{path}: cannot resolve interpolation at {getattr(err, 'full_key', '?')!r}: "
                          f"{str(err).splitlines()[0]}") from None
    if not cfg.runner.logger.experiment_name:  # a run's identity for runner.resume_dir=auto
        cfg.runner.logger.experiment_name = path.stem
    # workers run elsewhere: relative paths mean nothing there (each is checked where it is read)
    resolve_paths(cfg, check_driver_paths=check_datasets)
    return cfg


def with_log_dir(cfg: DictConfig, log_dir: Path) -> DictConfig:
    """``cfg`` with ``runner.log_dir`` set to the run's real folder, as its config.yaml records it."""
    cfg = OmegaConf.merge(cfg, {"runner": {"log_dir": str(Path(log_dir).resolve())}})
    OmegaConf.set_readonly(cfg, True)
    return cfg


def to_yaml(cfg: DictConfig | ListConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
