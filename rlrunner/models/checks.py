"""The checks of the model's keys (``actor.model.*``, each family section's under ``<family>``), ``model_type:
auto`` resolved, and across keys: a model is named, the family's guidance kinds, folder and resolution, its experts,
and context parallelism over its token sequence. Each raises :class:`~rlrunner.config.errors.RecipeError` with one
line, before any worker starts; registered in :mod:`rlrunner.recipe`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlrunner.algorithms.samplers import SAMPLERS
from rlrunner.config.check_kinds import POSITIVE_INT, Check, Choice, Context, Free, InPathTable, Range, Rule, names
from rlrunner.config.errors import fail as _fail
from rlrunner.models import MODEL_FAMILIES
from rlrunner.models.guidance import GUIDANCE_KINDS, Guidance
from rlrunner.models.wan import CONDITION_MODES
from rlrunner.models.wan_a14b import TRAIN_EXPERTS
from rlrunner.utils.device import DEVICE_NAMES, PRECISIONS

# ------------------------------------------------------------------------------------------- the keys' checks


def _is_resolution(res: Any) -> bool:
    def side(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x > 0

    return side(res) or (isinstance(res, (list, tuple, ListConfig)) and len(res) == 2 and all(side(x) for x in res))


def _low_noise_scale(fallback: str) -> Rule:
    """A two-expert model's low-noise guidance scale: null (``fallback``'s value) or a number >= 1."""
    return Rule(lambda g: g is None or (isinstance(g, (int, float)) and not isinstance(g, bool) and g >= 1),
                f"null (= {fallback}) or a scale >= 1 for the low-noise expert")


# no fp16: the actor trains its LoRA weights without loss scaling, so fp16 gradients underflow to zero silently; the
# rollout samples in the same actor.model.precision (it has no key of its own), so the line names what to set
_TRAINED_PRECISION = Rule(lambda p: p in PRECISIONS and p != "fp16",
                          "bf16, or fp32 (fp16 trains the LoRA without loss scaling: its gradients underflow silently; "
                          "the rollout samples in the same precision)")

_FAMILY = {
    "resolution": Rule(_is_resolution, "a positive int (square) or [height, width] of positive ints"),
    "num_frames": Rule(lambda n: n >= 1 and (n - 1) % 4 == 0, "4k+1 (1, 5, 9, ...; 1 = image)"),
    "num_steps": POSITIVE_INT,
    "eval_num_steps": POSITIVE_INT,
    "guidance_scale": Range(low=1, meaning="1 = no classifier-free guidance"),
    "eval_guidance_scale": Range(low=1, meaning="1 = no classifier-free guidance"),
    "guidance_scale_2": _low_noise_scale("guidance_scale"),
    "eval_guidance_scale_2": _low_noise_scale("eval_guidance_scale"),
    "train_experts": Choice(names(TRAIN_EXPERTS)),
    "negative_prompt": Free("any text"),
    "train_sampler": Choice(names(SAMPLERS)),
    "eval_sampler": Choice(names(SAMPLERS)),
    "shift": Rule(lambda s: s is None or (isinstance(s, (int, float)) and not isinstance(s, bool) and s > 0),
                  "null (the pipeline's own schedule) or a sigma shift > 0"),
    "guidance": Choice(names(GUIDANCE_KINDS)),
    "max_sequence_length": POSITIVE_INT,
    "condition_mode": Choice(names(CONDITION_MODES)),
    "use_lora": Rule(bool, "true: NFT keeps its old policy as a second LoRA adapter"),
    "lora_rank": POSITIVE_INT,
    "lora_alpha": Range(low=0, low_open=True),
    "lora_path": InPathTable("a local folder or a hub id"),
    "gradient_checkpointing": Free("bool"),
    "offload_text_encoder": Free("bool"),
    "offload_vae": Free("bool"),
    "cfg_truncation": Range(low=0, meaning="zimage: no guidance once 1 - sigma exceeds it; 1.0 = never"),
    "cfg_normalization": Range(low=0, meaning="zimage: cap on the guided / conditional norm ratio; 0 = off"),
    "vae_tiling": Free("bool"), "vae_slicing": Free("bool"),
}

KEY_CHECKS: dict[str, Check] = {
    "actor.model.model_path": InPathTable("a local folder or a hub id"),
    "actor.model.model_type": Choice(names(MODEL_FAMILIES, first=("auto",))),
    "actor.model.precision": _TRAINED_PRECISION,
    "actor.model.device": Choice(names(DEVICE_NAMES)),
    "actor.model.half_precision_on_cpu": Free("bool"),
    **{f"actor.model.<family>.{key}": check for key, check in _FAMILY.items()},
}

# ------------------------------------------------------------------------------------------- across keys


def check_model(cfg: DictConfig, ctx: Context) -> None:
    """A model is named; whether its folder exists is the path table's check (rlrunner.config.paths)."""
    if not cfg.actor.model.model_path:
        _fail("actor.model.model_path is empty; set it to a local diffusers folder or a hub id "
              "(e.g. actor.model.model_path=stabilityai/stable-diffusion-3.5-medium)")


def check_model_family(cfg: DictConfig, ctx: Context) -> None:
    """:func:`check_family` of the recipe's model, its relative folder taken from ``ctx.base_dir``; the guidance it
    resolves is ``ctx.resolved["guidance"]`` for the checks after it."""
    ctx.resolved["guidance"] = check_family(cfg, ctx.base_dir)


def check_model_sequence(cfg: DictConfig, ctx: Context) -> None:
    """:func:`check_context_parallel` of the recipe's model, its relative folder taken from ``ctx.base_dir``."""
    check_context_parallel(cfg, ctx.base_dir)


def resolve_model_type(cfg: DictConfig, base_dir: Path) -> None:
    """``actor.model.model_type: auto`` becomes the family that knows the local folder's ``model_index.json``
    (:func:`rlrunner.models.detect_model_type`); relative paths are taken from ``base_dir``. A model type whose
    plugin failed to load is refused here, naming the entry point, before the key checks would call it unknown."""
    from rlrunner.models import detect_model_type
    from rlrunner.models.families import plugin_failure

    model = cfg.actor.model
    if (why := plugin_failure(model.model_type)) is not None:
        _fail(why)
    if model.model_type != "auto":
        return

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
    from rlrunner.models.meta import CONFIG_FILE, read_config_file

    return {name: read_config_file(folder / name / CONFIG_FILE, f"{name} is listed in model_index.json")
            for name in index if not name.startswith("_") and (folder / name / CONFIG_FILE).is_file()}


def check_context_parallel(cfg: DictConfig, base_dir: Path) -> None:
    """Context parallelism needs a denoiser with a diffusers ``_cp_plan``, an attention backend diffusers runs the
    mode on (for ring one that returns the log-sum-exp), heads divisible by the Ulysses degree, and every sequence
    the plan splits (the latent's tokens, and the text's where it splits those) divisible by the CP degree."""
    sizes = {"actor": cfg.actor.context_parallel_size, "rollout": cfg.rollout.context_parallel_size}
    if max(sizes.values()) == 1:
        return
    from rlrunner.distributed.context_parallel import backend_problem, configured_backend, denoiser_class, has_cp_plan
    from rlrunner.models import MODEL_FAMILIES, model_class

    model_type, family_cfg = cfg.actor.model.model_type, cfg.actor.model[cfg.actor.model.model_type]
    key = next(f"{role}.context_parallel_size={cp}" for role, cp in sizes.items() if cp > 1)
    family = model_class(model_type)
    denoiser = denoiser_class(family.pipeline_class_name)
    if denoiser is None or not has_cp_plan(denoiser):
        _fail(f"{key}: the {model_type} denoiser ({getattr(denoiser, '__name__', 'none')}) has no diffusers _cp_plan; "
              f"families with one: {', '.join(f for f in MODEL_FAMILIES if has_cp_plan(_denoiser_of(f)))}")
    # the rollout's CP is always Ulysses; the backend is the one the workers will import diffusers with
    modes = {role: cfg.actor.context_parallel_mode if role == "actor" else "ulysses" for role in sizes}
    backend = configured_backend()
    for role in (r for r, cp in sizes.items() if cp > 1):
        what = f"{role}.context_parallel_size={sizes[role]} with " + \
            ("actor.context_parallel_mode=" if role == "actor" else "the rollout's mode ") + modes[role]
        if problem := backend_problem(backend, modes[role], what):
            _fail(f"{problem}; set DIFFUSERS_ATTN_BACKEND (now {backend!r}) to one of them")
    folder = base_dir / Path(cfg.actor.model.model_path).expanduser()
    if (folder / "model_index.json").is_file():
        for role, cp in sizes.items():
            if problem := _sequence_problem(family, family_cfg, folder, cp, modes[role], denoiser):
                _fail(f"{role}.context_parallel_size={cp} with actor.model.{model_type}: {problem}")


def _denoiser_of(model_type: str) -> type:
    from rlrunner.distributed.context_parallel import denoiser_class
    from rlrunner.models import model_class

    return denoiser_class(model_class(model_type).pipeline_class_name) or object


def _sequence_problem(family: Any, family_cfg: DictConfig, folder: Path, cp: int, mode: str,
                      denoiser: type) -> str | None:
    """Why ``cp`` ranks cannot split this family's sequences at ``family_cfg``'s size (the nearest sizes that they
    can, when a token count is the problem), or None."""
    from rlrunner.distributed.context_parallel import sequence_problem
    from rlrunner.models.meta import read_components

    _, components = read_components(folder)
    configs = {name: component.config for name, component in components.items()}
    heads = configs.get("transformer", {}).get("num_attention_heads")
    shapes = family.sample_shapes(family_cfg, configs)
    problem = sequence_problem(shapes.image_tokens, heads, cp, mode, "the latent")
    if problem is None:
        return _text_problem(family, family_cfg, shapes.text_tokens, cp, denoiser)
    if shapes.image_tokens % cp == 0:
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


def _text_problem(family: Any, family_cfg: DictConfig, tokens: int, cp: int, denoiser: type) -> str | None:
    """Why ``cp`` ranks cannot split the ``tokens`` text tokens that ``denoiser``'s ``_cp_plan`` splits (FLUX.1,
    FLUX.2; Qwen-Image pads its text itself), naming ``max_sequence_length`` values that divide, or None."""
    from rlrunner.distributed.context_parallel import splits_text

    if cp <= 1 or tokens % cp == 0 or family.pads_text_for_cp or not splits_text(denoiser):
        return None
    key, below, above = f"actor.model.{family.model_type}.max_sequence_length", tokens // cp * cp, tokens // cp * cp + cp
    fits = [n for n in (below, above) if n > 0 and not (family.max_text_tokens and n > family.max_text_tokens)]
    return f"the {denoiser.__name__} _cp_plan splits the text too, and its {tokens} tokens ({key}={tokens}) are " \
           f"not divisible by context parallel size {cp}; set {key} to {' or '.join(map(str, fits))}"
