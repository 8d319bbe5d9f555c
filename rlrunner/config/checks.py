"""The check of every recipe key on its own: a type, a range, a choice list or a path, one entry per schema leaf.

``KEY_CHECKS`` is keyed by dotted key, with ``<split>`` standing for ``train``/``eval`` and ``<family>`` for each
model family section (``actor.model.tiny``, ``actor.model.sd3``, ...). tests/config/test_checks.py fails when a
leaf of the schema has no entry, so a new key cannot ship unchecked: add it here with the narrowest check that
fits. Choice lists are read from the registries when a recipe is checked, so they cannot drift from the code.
Checks that need other keys (batch shares, video consistency, dataset files) are in
:mod:`rlrunner.config.validate`; their entries here say so (``Elsewhere``).
"""

from __future__ import annotations

import difflib
import importlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlrunner.config.check_kinds import Check, Choice, Context, Each, Elsewhere, Free, InPathTable, Range, Rule

# ------------------------------------------------------------------------------------- registries, read lazily


def _registry(module: str, name: str, *, first: tuple[str, ...] = ()) -> Callable[[], list[str]]:
    """The names of registry ``module.name`` (a dict or tuple), imported when a recipe is checked."""
    return lambda: [*first, *getattr(importlib.import_module(module), name)]


def _fixed(*names: str) -> Callable[[], Iterable[str]]:
    """Keys whose only consumer takes these names (no registry of their own)."""
    return lambda: names


# ------------------------------------------------------------------------------------------- value rules


def is_tau(spec: Any) -> bool:
    """``algorithm.nft_tau``: a number in (0, 1] or [start, end, start_step, end_step] with start_step <= end_step."""
    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if number(spec):
        return 0 < spec <= 1
    return (isinstance(spec, (list, tuple, ListConfig)) and len(spec) == 4 and all(number(x) for x in spec)
            and 0 <= spec[0] <= 1 and 0 <= spec[1] <= 1 and 0 <= spec[2] <= spec[3])


TAU_ALLOWED = "a number in (0, 1] or [start, end, start_step, end_step] with 0 <= start_step <= end_step, e.g. " \
              "[1.0, 0.01, 30, 70]"


def _is_resolution(res: Any) -> bool:
    def side(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x > 0

    return side(res) or (isinstance(res, (list, tuple, ListConfig)) and len(res) == 2 and all(side(x) for x in res))


def _is_url(value: Any) -> bool:
    url = urlsplit(str(value))
    return value == "" or (url.scheme in ("http", "https") and bool(url.hostname))


def _is_reward_parts(parts: Any) -> bool:
    return isinstance(parts, (list, ListConfig)) and all(isinstance(p, (dict, DictConfig)) for p in parts)


POSITIVE_INT = Range(low=1)
COUNT = Range(low=0)  # 0 = off / none, where the key's comment says so
SEED = Range(low=0, high=2**32 - 1, meaning="numpy and torch seeds")
UNIT_OPEN = Range(low=0, high=1, high_open=True)

_REWARD = {
    "type": Choice(_registry("rlrunner.rewards", "REWARD_TYPES")),
    "model": Choice(_registry("rlrunner.rewards", "REWARDS")),
    "key": Free("RLinf's name of the reward's output key; not read"),
    "engine": Choice(_registry("rlrunner.rewards", "ENGINES", first=("auto",))),
    "use_gpu": Free("bool"),
    "lang": Free("an OCR language code, passed to the engine, which rejects unknown ones when it loads"),
    "ocr_version": Choice(_registry("rlrunner.rewards.ocr.engines", "PADDLE_MODELS")),
    "rec_only": Free("bool"),
    # >= 1 on every recipe: the video check (validate._check_video) runs only when num_frames > 1, so a range that
    # let 0 through ("one reward per frame", which never matches a video's latent frames) passed on image recipes
    "frame_interval": Range(low=1, meaning="frames per chunk reward; 4 = the video VAE's temporal compression"),
    "batch_size": POSITIVE_INT,
    "num_workers": POSITIVE_INT,
    "weight": Range(meaning="weight of this part in a multi reward"),
    "alphabet": Free("the characters to keep; any text"),
    "rewards": Rule(_is_reward_parts, "a list of mappings of reward keys (parts of a multi reward)"),
    "aggregation": Choice(_registry("rlrunner.rewards.multi", "AGGREGATIONS")),
    "model_path": InPathTable("a local folder/file or a hub id"),
    "processor_path": InPathTable("a local folder or hub id of the tokenizer/processor, or empty (= model_path)"),
    "head_path": InPathTable("a file"),
    "precision": Choice(_registry("rlrunner.utils.device", "PRECISIONS")),
    "url": Rule(_is_url, "an http(s) URL such as http://127.0.0.1:8000, or empty"),
    "token_file": InPathTable("a file"),
    "base_url": Rule(_is_url, "an http(s) URL such as http://127.0.0.1:8000/v1, or empty"),
    "served_model": Free("the model name the endpoint serves; required for vlm_ocr and the judges (validate)"),
    "api_key_file": InPathTable("a file"),
    "judge_prompt": Rule(lambda t: not t or "{prompt}" in t, "empty (the judge's own template) or a text with "
                                                               "{prompt} where the caption goes"),
    "top_logprobs": Range(low=1, high=20, meaning="tokens with logprobs the endpoint returns (OpenAI: at most 20)"),
    "timeout_s": Range(low=0, low_open=True, meaning="seconds per scoring attempt"),
    "max_engine_rebuilds": COUNT,
    "max_retries": COUNT,
    "max_concurrency": POSITIVE_INT,
    "required": Free("bool"),
}
def _low_noise_scale(fallback: str) -> Rule:
    """A two-expert model's low-noise guidance scale: null (``fallback``'s value) or a number >= 1."""
    return Rule(lambda g: g is None or (isinstance(g, (int, float)) and not isinstance(g, bool) and g >= 1),
                f"null (= {fallback}) or a scale >= 1 for the low-noise expert")


_FAMILY = {
    "resolution": Rule(_is_resolution, "a positive int (square) or [height, width] of positive ints"),
    "num_frames": Rule(lambda n: n >= 1 and (n - 1) % 4 == 0, "4k+1 (1, 5, 9, ...; 1 = image)"),
    "num_steps": POSITIVE_INT,
    "eval_num_steps": POSITIVE_INT,
    "guidance_scale": Range(low=1, meaning="1 = no classifier-free guidance"),
    "eval_guidance_scale": Range(low=1, meaning="1 = no classifier-free guidance"),
    "guidance_scale_2": _low_noise_scale("guidance_scale"),
    "eval_guidance_scale_2": _low_noise_scale("eval_guidance_scale"),
    "train_experts": Choice(_registry("rlrunner.models.wan_a14b", "TRAIN_EXPERTS")),
    "negative_prompt": Free("any text"),
    "train_sampler": Choice(_registry("rlrunner.algorithms.samplers", "SAMPLERS")),
    "eval_sampler": Choice(_registry("rlrunner.algorithms.samplers", "SAMPLERS")),
    "shift": Rule(lambda s: s is None or (isinstance(s, (int, float)) and not isinstance(s, bool) and s > 0),
                  "null (the pipeline's own schedule) or a sigma shift > 0"),
    "guidance": Choice(_registry("rlrunner.models.guidance", "GUIDANCE_KINDS")),
    "max_sequence_length": POSITIVE_INT,
    "condition_mode": Choice(_registry("rlrunner.models.wan", "CONDITION_MODES")),
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
_SPLIT = {
    "total_num_envs": POSITIVE_INT,
    "rollout_epoch": POSITIVE_INT,
    "dataset.type": Choice(_fixed("ocr")),  # prompt files (rlrunner/data/prompts.py)
    "dataset.path": InPathTable("a prompt file or folder (its files: _check_env, with dataset.split)"),
    "dataset.split": Elsewhere("_check_env (<split>.txt, .jsonl or .parquet must exist in dataset.path)"),
    "dataset.prompt_key": Elsewhere("_check_env (each record of a .jsonl or .parquet dataset.path must have it)"),
    **{f"reward.{key}": check for key, check in _REWARD.items()},
    "video_cfg.save_video": Free("bool"),
    "video_cfg.video_base_dir": InPathTable("a folder, created when videos are saved"),
    "video_cfg.fps": POSITIVE_INT,
}

KEY_CHECKS: dict[str, Check] = {
    "cluster.num_nodes": POSITIVE_INT,
    "cluster.num_devices_per_node": Range(low=0, meaning="0 = detect"),
    "cluster.component_placement": Elsewhere("check_placement (parse_placement with the node and device counts)"),
    "cluster.backend": Choice(_registry("rlrunner.cluster.factory", "BACKENDS")),
    "cluster.ray_address": Free("'auto', host:port or empty; Ray reports an unreachable address when it connects"),
    "cluster.ship_code": Free("bool"),
    "cluster.cpus_per_worker": Range(low=0, low_open=True),
    "cluster.worker_timeout_s": Range(low=0, low_open=True, meaning="seconds"),
    "cluster.rejoin_timeout_s": Range(low=0, meaning="seconds"),
    "cluster.enable_offload": Free("bool"),
    "runner.max_steps": Range(low=-1, meaning="-1 = unset; runner.max_steps or max_epochs must be positive"),
    "runner.max_epochs": Range(low=-1, meaning="-1 = unset; runner.max_steps or max_epochs must be positive"),
    "runner.val_check_interval": Range(low=-1, meaning="0 = never after step 0; -1 (RLinf) = never, also not before "
                                                       "training"),
    "runner.val_before_train": Free("bool"),
    "runner.save_interval": Range(low=-1, meaning="0 = only at the end; -1 (RLinf) = never"),
    "runner.keep_last_n": Range(low=0, meaning="0 = keep all"),
    "runner.resume_dir": InPathTable("a checkpoint or run folder, or auto"),
    "runner.resume_allow_changes": Elsewhere("_check_resume (true, false or a list of dotted keys)"),
    "runner.log_dir": InPathTable("set by the launcher"),
    "runner.weight_sync_interval": POSITIVE_INT,
    "runner.sample_log_interval": Range(low=0, meaning="0 = never"),
    "runner.num_logged_samples": COUNT,
    "runner.async_reward": Free("bool"),
    "runner.rollout_ahead": Free("bool"),
    "runner.max_nonfinite_steps": POSITIVE_INT,
    "runner.max_reward_error_steps": POSITIVE_INT,
    "runner.max_restarts": Range(low=0, meaning="0 = stop at the first lost worker"),
    "runner.save_on_signal": Free("bool"),
    "runner.seed": SEED,
    "runner.logger.log_path": InPathTable("a folder, created at start"),
    "runner.logger.experiment_name": Free("any text"),
    "runner.logger.project_name": Free("any text"),
    "runner.logger.logger_backends": Each(Choice(_registry("rlrunner.tracking.logger", "LOGGER_BACKENDS"))),
    "algorithm.name": Choice(_registry("rlrunner.objectives", "OBJECTIVES")),
    "algorithm.group_size": Range(low=2, meaning="group-relative advantages need 2 or more samples per prompt"),
    "algorithm.adv_type": Choice(_registry("rlrunner.algorithms.advantages", "ADVANTAGE_ESTIMATORS")),
    "algorithm.advantage_mode": Elsewhere("_check_algorithm (the modes of algorithm.adv_type)"),
    "algorithm.adv_clip_max": Range(low=0, low_open=True),
    "algorithm.nft_beta": Range(low=0, low_open=True),
    "algorithm.nft_target_space": Choice(_registry("rlrunner.algorithms.nft", "TARGET_SPACES")),
    "algorithm.nft_weight_mode": Choice(_registry("rlrunner.algorithms.nft", "WEIGHT_MODES")),
    "algorithm.nft_clip_ratio": Range(low=0, low_open=True, optional=True, meaning="null = no clipping"),
    "algorithm.nft_tau": Rule(is_tau, TAU_ALLOWED),
    "algorithm.nft_decay_type": Choice(_registry("rlrunner.algorithms.ema", "DECAY_SCHEDULES", first=("",))),
    "algorithm.nft_xcur_source": Choice(_registry("rlrunner.objectives.nft", "XCUR_SOURCES")),
    "algorithm.nft_train_timesteps": Choice(_registry("rlrunner.algorithms.samplers", "TRAIN_TIMESTEPS")),
    "algorithm.nft_timesteps_per_sample": POSITIVE_INT,  # and <= num_steps with nft_xcur_source rollout (validate)
    "algorithm.ref_kl_coef": Range(low=0, meaning="0 = no KL anchor"),
    "algorithm.reward_signal": Choice(_fixed("reward", "none", "shuffle")),  # Runner.advantages
    "algorithm.flow_grpo_noise_level": Range(low=0, low_open=True, meaning="the SDE's noise level a"),
    "algorithm.flow_grpo_clip_range": Range(low=0, low_open=True),
    "algorithm.flow_grpo_timestep_fraction": Range(low=0, high=1, low_open=True, meaning="share of SDE steps trained"),
    "algorithm.flow_grpo_sde_window_size": Range(low=0, meaning="0 = every step is an SDE step"),
    "algorithm.flow_grpo_sde_window_range": Rule(
        lambda r: r is None or (isinstance(r, (list, tuple, ListConfig)) and len(r) == 2
                                and all(isinstance(x, int) and not isinstance(x, bool) for x in r) and 0 <= r[0] < r[1]),
        "null or [first, end] steps with 0 <= first < end (within num_steps: validate._check_flow_grpo)"),
    "algorithm.awm_weighting": Choice(_registry("rlrunner.algorithms.awm", "WEIGHTINGS")),
    "algorithm.awm_ghuber_power": Range(low=0, low_open=True),
    "algorithm.awm_timesteps": Choice(_registry("rlrunner.objectives.awm", "TIMESTEPS")),
    "algorithm.awm_timestep_fraction": Range(low=0, high=1, low_open=True,
                                             meaning="the share of the sampler's steps trained on"),
    "algorithm.awm_timesteps_per_sample": POSITIVE_INT,
    "algorithm.awm_ema_kl_coef": Range(low=0, meaning="0 = no EMA anchor"),
    **{f"env.<split>.{key}": check for key, check in _SPLIT.items()},
    "actor.micro_batch_size": POSITIVE_INT,
    "actor.global_batch_size": POSITIVE_INT,
    "actor.seed": SEED,
    "actor.strategy": Choice(_registry("rlrunner.cluster.parallelize", "ENGINES")),
    "actor.one_rank_group": Free("bool"),
    "actor.context_parallel_size": POSITIVE_INT,  # and the model's heads and tokens (model_checks.check_context_parallel)
    "actor.context_parallel_mode": Choice(_registry("rlrunner.cluster.context_parallel", "CP_MODES")),
    "rollout.context_parallel_size": POSITIVE_INT,
    "actor.model.model_path": InPathTable("a local folder or a hub id"),
    "actor.model.model_type": Choice(_registry("rlrunner.models", "MODEL_FAMILIES", first=("auto",))),
    "actor.model.precision": Choice(_registry("rlrunner.utils.device", "PRECISIONS")),
    "actor.model.device": Choice(_registry("rlrunner.utils.device", "DEVICE_NAMES")),
    "actor.model.half_precision_on_cpu": Free("bool"),
    **{f"actor.model.<family>.{key}": check for key, check in _FAMILY.items()},
    "actor.optim.optimizer": Choice(_fixed("adamw")),  # workers/actor.py builds AdamW
    "actor.optim.lr": Range(low=0, low_open=True),
    "actor.optim.weight_decay": Range(low=0),
    "actor.optim.adam_beta1": UNIT_OPEN,
    "actor.optim.adam_beta2": UNIT_OPEN,
    "actor.optim.adam_eps": Range(low=0, low_open=True),
    "actor.optim.clip_grad": Range(low=0, low_open=True, meaning="max gradient norm"),
    "actor.optim.lr_scheduler": Choice(_fixed("constant", "cosine", "linear")),  # diffusers get_scheduler names
    "actor.optim.lr_warmup_steps": Range(low=0),
}


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
    """The model family sections of ``actor.model`` (each a FamilyConfig)."""
    return [key for key in cfg.actor.model if _is_section(cfg.actor.model._get_node(key))]


def problems(cfg: DictConfig, ctx: Context) -> Iterator[str]:
    """One line per bad key: the key, its value and what is allowed."""
    families = family_sections(cfg)
    for dotted, value in leaves(cfg):
        check = KEY_CHECKS[table_key(dotted, families)]
        plain = OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value
        if (why := check.problem(plain, ctx)) is not None:
            yield f"{dotted}={plain!r} {why}"


def reward_part_problems(prefix: str, part: dict[str, Any], ctx: Context) -> Iterator[str]:
    """The same checks for one part of a multi reward (a plain mapping with the keys it inherits)."""
    for key, value in part.items():
        if key not in _REWARD:
            close = difflib.get_close_matches(key, list(_REWARD), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; valid keys: {', '.join(_REWARD)}"
            yield f"{prefix}.{key} is not a reward key{hint}"
        elif (why := _REWARD[key].problem(value, ctx)) is not None:
            yield f"{prefix}.{key}={value!r} {why}"
