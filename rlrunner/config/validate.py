"""Cross-field checks of a merged recipe, run before any worker (or Ray) starts.

Every check raises :class:`~rlrunner.config.loader.RecipeError` with one line: the key, the bad value, and
what to change.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from omegaconf import DictConfig, ListConfig, OmegaConf

COMPONENTS = ("actor", "rollout", "env")
CHOICES: dict[str, tuple[str, ...]] = {
    "cluster.backend": ("ray", "local"),
    "algorithm.adv_type": ("grpo", "grpo_video"),
    "algorithm.nft_target_space": ("x0",),
    "algorithm.nft_weight_mode": ("adaptive", "constant"),
    "algorithm.nft_xcur_source": ("resample",),
    "algorithm.nft_decay_type": ("", "copy", "linear_to_0_5", "delayed_linear_to_0_999"),
    "algorithm.reward_signal": ("reward", "none", "shuffle"),
    "actor.strategy": ("ddp", "fsdp2"),
    "actor.model.precision": ("bf16", "fp16", "fp32"),
    "actor.model.device": ("auto", "cpu", "cuda", "npu"),
    "actor.optim.optimizer": ("adamw",),
    "actor.optim.lr_scheduler": ("constant", "cosine", "linear"),
    "env.train.dataset.type": ("ocr",),
    "env.eval.dataset.type": ("ocr",),
}
ADVANTAGE_MODES = {"grpo": ("group", "global", "none"), "grpo_video": ("video", "frame")}
# reward keys that a reward model cannot do without, and the keys that hold URLs or files (checked when set)
REWARD_NEEDS = {"remote": ("url",), "vlm_ocr": ("base_url", "served_model")}
REWARD_URL_KEYS = ("url", "base_url")
REWARD_FILE_KEYS = ("token_file", "api_key_file")


def _fail(message: str) -> None:
    from rlrunner.config.loader import RecipeError

    raise RecipeError(message)


def _get(cfg: DictConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def _check_choice(key: str, value: Any, valid: Iterable[str]) -> None:
    valid = list(valid)
    if value not in valid:
        close = difflib.get_close_matches(str(value), [v for v in valid if v], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        _fail(f"{key}={value!r} is not valid{hint}; choose one of {valid}")


def _check_positive(cfg: DictConfig, *keys: str) -> None:
    for key in keys:
        if _get(cfg, key) <= 0:
            _fail(f"{key}={_get(cfg, key)} must be positive")


def _is_local_path(value: str) -> bool:
    return value.startswith((".", "/", "~")) or Path(value).expanduser().exists() or value.count("/") != 1


def check_tau(spec: Any, key: str = "algorithm.nft_tau") -> None:
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        ok = spec > 0
    else:
        ok = isinstance(spec, (list, tuple, ListConfig)) and len(spec) == 4 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in spec) and spec[2] <= spec[3]
    if not ok:
        _fail(f"{key}={spec!r} must be a positive number or [start, end, start_step, end_step] with "
              f"start_step <= end_step, e.g. [1.0, 0.01, 30, 70]")


def _check_family(cfg: DictConfig, base_dir: Path) -> None:
    from rlrunner.algorithms.samplers import SAMPLERS
    from rlrunner.models import MODEL_FAMILIES

    model = cfg.actor.model
    _check_choice("actor.model.model_type", model.model_type, sorted(MODEL_FAMILIES))
    family_key = f"actor.model.{model.model_type}"
    family = model[model.model_type]
    for sampler_key in ("train_sampler", "eval_sampler"):
        _check_choice(f"{family_key}.{sampler_key}", family[sampler_key], sorted(SAMPLERS))
    _check_positive(cfg, f"{family_key}.num_steps", f"{family_key}.eval_num_steps", f"{family_key}.lora_rank")
    res = family.resolution
    if not (isinstance(res, int) and res > 0) and not (
            isinstance(res, ListConfig) and len(res) == 2 and all(isinstance(x, int) and x > 0 for x in res)):
        _fail(f"{family_key}.resolution={res!r} must be a positive int or [height, width]")
    if family.num_frames < 1 or (family.num_frames - 1) % 4:
        _fail(f"{family_key}.num_frames={family.num_frames} must be 4k+1 (1, 5, 9, ...; 1 = image)")
    if not family.use_lora:
        _fail(f"{family_key}.use_lora=false is not supported: NFT keeps its old policy as a second LoRA adapter")
    if not model.model_path:
        _fail("actor.model.model_path is empty; set it to a local diffusers folder or a hub id "
              "(e.g. actor.model.model_path=stabilityai/stable-diffusion-3.5-medium)")
    if _is_local_path(model.model_path) and not (base_dir / Path(model.model_path).expanduser()).exists():
        _fail(f"actor.model.model_path={model.model_path!r} does not exist (relative paths are taken from "
              f"{base_dir}); point it at a diffusers folder or use a hub id like org/name")
    if family.lora_path and not (base_dir / family.lora_path).exists():
        _fail(f"{family_key}.lora_path={family.lora_path!r} does not exist")


def _check_env(cfg: DictConfig, split: str, base_dir: Path, check_datasets: bool) -> None:
    env = cfg.env[split]
    group_size = cfg.algorithm.group_size
    _check_positive(cfg, f"env.{split}.total_num_envs", f"env.{split}.rollout_epoch")
    if split == "train" and env.total_num_envs % group_size:
        _fail(f"env.train.total_num_envs={env.total_num_envs} is not a multiple of algorithm.group_size="
              f"{group_size}; use e.g. {max(1, env.total_num_envs // group_size) * group_size}")
    if not check_datasets:
        return
    if not env.dataset.path:
        _fail(f"env.{split}.dataset.path is empty; set it to a directory with {env.dataset.split}.txt or a .txt file")
    path = base_dir / Path(env.dataset.path).expanduser()
    if not path.exists():
        _fail(f"env.{split}.dataset.path={env.dataset.path!r} does not exist (relative paths are taken from "
              f"{base_dir})")
    if path.is_dir() and not (path / f"{env.dataset.split}.txt").is_file():
        source = path / "SOURCE.md"
        hint = f"; {source} says where to get it" if source.is_file() else ""
        _fail(f"env.{split}.dataset.path={env.dataset.path!r} has no {env.dataset.split}.txt "
              f"(env.{split}.dataset.split={env.dataset.split!r}); found: "
              f"{sorted(p.name for p in path.glob('*.txt')) or 'no .txt files'}{hint}")


def _check_reward(cfg: DictConfig, split: str, base_dir: Path) -> None:
    """The reward (each part of a multi reward, with the keys it inherits): model name, service keys, ranges."""
    from rlrunner.rewards import REWARDS

    reward = OmegaConf.to_container(cfg.env[split].reward, resolve=True)
    prefix = f"env.{split}.reward"
    parts = [(prefix, reward)]
    if reward["type"] == "multi":
        parts = [(f"{prefix}.rewards[{i}]", {**reward, **part}) for i, part in enumerate(reward["rewards"])
                 if isinstance(part, dict)]
    for key, part in parts:
        _check_choice(f"{key}.model", part.get("model"), sorted(REWARDS))
        for needed in REWARD_NEEDS.get(part["model"], ()):
            if not part.get(needed):
                _fail(f"{key}.{needed} is empty; reward.model={part['model']} needs it (see README, Rewards as a "
                      f"service)")
        for url_key in REWARD_URL_KEYS:
            url = urlsplit(str(part.get(url_key) or ""))
            if part.get(url_key) and (url.scheme not in ("http", "https") or not url.hostname):
                _fail(f"{key}.{url_key}={part[url_key]!r} is not an http(s) URL; e.g. http://127.0.0.1:8000")
        for file_key in REWARD_FILE_KEYS:
            if part.get(file_key) and not (base_dir / Path(part[file_key]).expanduser()).is_file():
                _fail(f"{key}.{file_key}={part[file_key]!r} does not exist (relative paths are taken from {base_dir})")
        if not part["timeout_s"] > 0:
            _fail(f"{key}.timeout_s={part['timeout_s']} must be > 0 (seconds per request attempt)")
        if part["max_retries"] < 0 or part["max_concurrency"] < 1:
            _fail(f"{key}.max_retries={part['max_retries']} must be >= 0 and {key}.max_concurrency="
                  f"{part['max_concurrency']} >= 1")


def _check_batches(cfg: DictConfig, num_actor_workers: int) -> None:
    actor = cfg.actor
    step = actor.micro_batch_size * num_actor_workers
    if actor.global_batch_size % step:
        _fail(f"actor.global_batch_size={actor.global_batch_size} is not divisible by actor.micro_batch_size="
              f"{actor.micro_batch_size} x {num_actor_workers} actor worker(s) = {step}")
    samples = cfg.env.train.total_num_envs * cfg.env.train.rollout_epoch
    if samples % actor.global_batch_size:
        _fail(f"one step rolls out env.train.total_num_envs x rollout_epoch = {samples} samples, not a multiple "
              f"of actor.global_batch_size={actor.global_batch_size}")


def validate(cfg: DictConfig, base_dir: Path, check_datasets: bool = True) -> None:
    """Reject contradictory or impossible recipes; ``base_dir`` anchors relative paths.

    ``check_datasets=False`` skips the prompt files (``rlrunner.plan`` sizes a run without reading prompts).
    """
    from rlrunner.cluster import detect_devices_per_node, parse_placement

    for key, valid in CHOICES.items():
        _check_choice(key, _get(cfg, key), valid)
    _check_choice("algorithm.advantage_mode", cfg.algorithm.advantage_mode, ADVANTAGE_MODES[cfg.algorithm.adv_type])
    if cfg.algorithm.nft_beta <= 0 or cfg.algorithm.adv_clip_max <= 0:
        _fail("algorithm.nft_beta and algorithm.adv_clip_max must be positive")
    if cfg.algorithm.nft_clip_ratio is not None and cfg.algorithm.nft_clip_ratio <= 0:
        _fail(f"algorithm.nft_clip_ratio={cfg.algorithm.nft_clip_ratio} must be positive or null (no clipping)")
    check_tau(cfg.algorithm.nft_tau)
    _check_positive(cfg, "algorithm.nft_timesteps_per_sample")
    _check_family(cfg, base_dir)
    _check_env(cfg, "train", base_dir, check_datasets)
    _check_env(cfg, "eval", base_dir, check_datasets)
    for split in ("train", "eval"):
        _check_reward(cfg, split, base_dir)
    _check_positive(cfg, "runner.max_reward_error_steps")
    _check_positive(cfg, "actor.micro_batch_size", "actor.global_batch_size", "algorithm.group_size")
    if cfg.runner.max_steps <= 0 and cfg.runner.max_epochs <= 0:
        _fail("set runner.max_steps or runner.max_epochs to a positive number")
    if _devices_known_offline(cfg.cluster):
        try:
            placement = parse_placement(cfg.cluster.component_placement, cfg.cluster.num_nodes,
                                        detect_devices_per_node(cfg.cluster))
        except (ValueError, TypeError) as err:
            _fail(str(err))
        check_placement(cfg, placement)


def _devices_known_offline(cluster: DictConfig) -> bool:
    """False when the recipe joins an existing Ray cluster and leaves its devices per node to detection: then
    the driver machine's devices say nothing, and the placement is checked after connecting (runner.run)."""
    joins = cluster.backend == "ray" and bool(cluster.ray_address or os.environ.get("RAY_ADDRESS"))
    return not joins or cluster.num_devices_per_node > 0


def check_placement(cfg: DictConfig, placement: Any) -> None:
    """Checks that need the placement (a :class:`~rlrunner.cluster.Placement`): batch and prompt shares."""
    _check_batches(cfg, placement.num_workers("actor"))
    if cfg.runner.rollout_ahead and cfg.cluster.enable_offload and placement.is_collocated("actor", "rollout"):
        _fail("runner.rollout_ahead=true needs the actor and rollout models on the device at the same time; it "
              "cannot be combined with cluster.enable_offload for collocated actor and rollout")
    prompts_per_epoch = cfg.env.train.total_num_envs // cfg.algorithm.group_size
    if prompts_per_epoch % placement.num_workers("rollout"):
        _fail(f"env.train.total_num_envs / algorithm.group_size = {prompts_per_epoch} prompts per rollout epoch "
              f"cannot be shared evenly by {placement.num_workers('rollout')} rollout workers")
    if cfg.env.eval.total_num_envs % placement.num_workers("rollout"):
        _fail(f"env.eval.total_num_envs={cfg.env.eval.total_num_envs} cannot be shared evenly by "
              f"{placement.num_workers('rollout')} rollout workers")
