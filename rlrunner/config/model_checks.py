"""Recipe checks of the model: ``model_type: auto``, the family's guidance kinds, folder and resolution, its experts,
and context parallelism over its token sequence; each raises :class:`~rlrunner.config.errors.RecipeError` with one
line, before any worker starts (called by :func:`rlrunner.config.validate.validate`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from rlrunner.config.errors import RecipeError

if TYPE_CHECKING:
    from rlrunner.models.guidance import Guidance


def _fail(message: str) -> None:
    raise RecipeError(message)


def resolve_model_type(cfg: DictConfig, base_dir: Path) -> None:
    """``actor.model.model_type: auto`` becomes the family that knows the local folder's ``model_index.json``
    (:func:`rlrunner.models.detect_model_type`); relative paths are taken from ``base_dir``."""
    model = cfg.actor.model
    if model.model_type != "auto":
        return
    from rlrunner.models import detect_model_type

    path = base_dir / Path(model.model_path).expanduser() if model.model_path else Path()
    try:
        model.model_type = detect_model_type(str(path) if model.model_path and path.exists() else model.model_path)
    except (ValueError, FileNotFoundError) as err:
        _fail(str(err))


def check_family(cfg: DictConfig, base_dir: Path) -> Guidance:
    """The family supports the recipe's guidance, and a local model folder (its ``model_index.json``) is one the
    family loads, at a resolution that patches evenly (hub ids are checked when a worker loads them). Returns the
    guidance resolved from the recipe and the folder's config files (:meth:`FlowModel.resolve_guidance`; the recipe
    alone for a hub id), which the later checks read."""
    from rlrunner.models import model_class
    from rlrunner.models.loading import read_model_index

    model = cfg.actor.model
    family, family_cfg, key = model_class(model.model_type), model[model.model_type], f"actor.model.{model.model_type}"
    if not family.expert_components and family_cfg.train_experts != "both":
        _fail(f"{key}.train_experts={family_cfg.train_experts!r} applies to a model with two experts "
              f"(wan22_t2v_a14b); {family.model_type} has one denoiser: remove it")
    folder = base_dir / Path(model.model_path).expanduser()
    if not (folder / "model_index.json").is_file():
        # a hub id, or a folder the loading worker reports on (it may exist only on the GPU nodes)
        return _resolve_or_fail(family, family_cfg, {}, key)
    try:
        index = read_model_index(str(folder))
        family.check_model_index(index, f"actor.model.model_path={model.model_path!r}")
        configs = {"model_index": index, **_component_configs(folder, index)}
    except (ValueError, FileNotFoundError) as err:
        _fail(_one_line(err, key))
    guidance = _resolve_or_fail(family, family_cfg, configs, key)
    try:
        family.sample_shapes(family_cfg, configs)
    except KeyError:
        pass  # a layout the family's shape rules do not read here; loading the model reports what is wrong
    except (ValueError, FileNotFoundError) as err:
        _fail(_one_line(err, key))
    return guidance


def _resolve_or_fail(family: Any, family_cfg: DictConfig, configs: dict[str, Any], key: str) -> Guidance:
    try:
        return family.resolve_guidance(family_cfg, configs)
    except ValueError as err:
        _fail(_one_line(err, key))


def _one_line(err: Exception, key: str) -> str:
    """A family's refusal as the recipe error: prefixed with the family's key unless it names a key itself."""
    return f"{key}: {err}" if not str(err).startswith("actor.model") else str(err)


def _component_configs(folder: Path, index: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``<component>/config.json`` of each model component ``model_index.json`` lists (what shape rules read)."""
    import json

    configs = {}
    for name in index:
        path = folder / name / "config.json"
        if not name.startswith("_") and path.is_file():
            configs[name] = json.loads(path.read_text())
    return configs


def check_context_parallel(cfg: DictConfig, base_dir: Path) -> None:
    """Context parallelism needs a denoiser with a diffusers ``_cp_plan``, heads divisible by the Ulysses degree,
    a token count divisible by the CP degree, and for ring an attention backend that returns the log-sum-exp."""
    sizes = {"actor": cfg.actor.context_parallel_size, "rollout": cfg.rollout.context_parallel_size}
    if max(sizes.values()) == 1:
        return
    from rlrunner.cluster.context_parallel import RING_BACKENDS, attention_backend, denoiser_class, has_cp_plan
    from rlrunner.models import MODEL_FAMILIES, model_class

    model_type, family_cfg = cfg.actor.model.model_type, cfg.actor.model[cfg.actor.model.model_type]
    key = next(f"{role}.context_parallel_size={cp}" for role, cp in sizes.items() if cp > 1)
    family = model_class(model_type)
    denoiser = denoiser_class(family.pipeline_class_name)
    if denoiser is None or not has_cp_plan(denoiser):
        _fail(f"{key}: the {model_type} denoiser ({getattr(denoiser, '__name__', 'none')}) has no diffusers _cp_plan; "
              f"families with one: {', '.join(f for f in MODEL_FAMILIES if has_cp_plan(_denoiser_of(f)))}")
    if cfg.actor.context_parallel_mode == "ring" and attention_backend() not in RING_BACKENDS:
        _fail(f"actor.context_parallel_mode=ring needs an attention backend that returns the log-sum-exp "
              f"({', '.join(RING_BACKENDS)}); this run's is {attention_backend()!r} (DIFFUSERS_ATTN_BACKEND); use "
              f"actor.context_parallel_mode=ulysses")
    folder = base_dir / Path(cfg.actor.model.model_path).expanduser()
    if (folder / "model_index.json").is_file():
        for role, cp in sizes.items():
            mode = cfg.actor.context_parallel_mode if role == "actor" else "ulysses"
            if problem := _sequence_problem(family, family_cfg, folder, cp, mode):
                _fail(f"{role}.context_parallel_size={cp} with actor.model.{model_type}: {problem}")


def _denoiser_of(model_type: str) -> type:
    from rlrunner.cluster.context_parallel import denoiser_class
    from rlrunner.models import model_class

    return denoiser_class(model_class(model_type).pipeline_class_name) or object


def _sequence_problem(family: Any, family_cfg: DictConfig, folder: Path, cp: int, mode: str) -> str | None:
    """Why ``cp`` ranks cannot split this family's sequence at ``family_cfg``'s size (the nearest sizes that they
    can, when the token count is the problem), or None."""
    from rlrunner.cluster.context_parallel import sequence_problem
    from rlrunner.sizing.meta import read_components

    _, components = read_components(folder)
    configs = {name: component.config for name, component in components.items()}
    heads = configs.get("transformer", {}).get("num_attention_heads")
    tokens = family.sample_shapes(family_cfg, configs).image_tokens
    problem = sequence_problem(tokens, heads, cp, mode, "the latent")
    if problem is None or tokens % cp == 0:
        return problem
    height, width = (family_cfg.resolution, family_cfg.resolution) if isinstance(family_cfg.resolution, int) \
        else tuple(family_cfg.resolution)
    video = family_cfg.num_frames > 1
    for step in range(1, 33):  # the nearest frame count (video) or height that divides
        for sign in (-1, 1):
            key, value = ("num_frames", family_cfg.num_frames + 4 * sign * step) if video else \
                ("resolution", [height + 16 * sign * step, width])
            if (value if video else value[0]) <= 0:
                continue
            try:
                if family.sample_shapes(OmegaConf.merge(family_cfg, {key: value}), configs).image_tokens % cp == 0:
                    return f"{problem} (at {key} {value} they are)"
            except ValueError:  # not a size the family takes
                continue
    return problem
