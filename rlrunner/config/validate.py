"""Checks of a merged recipe (each key, then across keys), run before any worker (or Ray) starts.

Every check raises :class:`~rlrunner.config.errors.RecipeError` with one line: the key, the bad value, and
what to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from rlrunner.config.checks import Context, problems, reward_part_problems
from rlrunner.config.errors import RecipeError
from rlrunner.config.model_checks import check_context_parallel, check_family
from rlrunner.config.paths import joins_cluster

if TYPE_CHECKING:
    from rlrunner.models.guidance import Guidance

# reward keys that a reward model cannot do without
REWARD_NEEDS = {"remote": ("url",), "geneval": ("url",), "vlm_ocr": ("base_url", "served_model"),
                "aesthetic": ("head_path",),
                **{judge: ("base_url", "served_model") for judge in ("unifiedreward", "unifiedreward2", "vlm_yesno")}}
# rewards that score one kind of input only (the others take images [B, H, W, 3] and frames [B, F, H, W, 3])
IMAGE_ONLY_REWARDS = ("ocr", "vlm_ocr")
VIDEO_ONLY_REWARDS = ("video_ocr",)


def _fail(message: str) -> None:
    raise RecipeError(message)


def _check_algorithm(cfg: DictConfig) -> None:
    from rlrunner.algorithms.advantages import ADVANTAGE_MODES

    alg = cfg.algorithm
    valid = ADVANTAGE_MODES[alg.adv_type]
    if alg.advantage_mode not in valid:
        _fail(f"algorithm.advantage_mode={alg.advantage_mode!r} is not valid for algorithm.adv_type={alg.adv_type!r}; "
              f"choose one of {list(valid)}")
    num_steps = cfg.actor.model[cfg.actor.model.model_type].num_steps
    if alg.nft_xcur_source == "rollout" and alg.nft_timesteps_per_sample > num_steps:
        _fail(f"algorithm.nft_timesteps_per_sample={alg.nft_timesteps_per_sample} exceeds the {num_steps} rollout "
              f"states of a sample (actor.model.{cfg.actor.model.model_type}.num_steps) that "
              f"algorithm.nft_xcur_source=rollout trains on; use at most {num_steps}")
    if cfg.runner.max_steps <= 0 and cfg.runner.max_epochs <= 0:
        _fail("set runner.max_steps or runner.max_epochs to a positive number")


def _check_flow_grpo(cfg: DictConfig, guidance: Guidance) -> None:
    """flow_grpo's rollout is its own Euler(-Maruyama) integrator without classifier-free guidance (``guidance``:
    the recipe's, resolved by :func:`check_family`), with one advantage per sample, and its SDE window lies within
    the sampling steps."""
    alg = cfg.algorithm
    if alg.name != "flow_grpo":
        return
    from rlrunner.algorithms.flow_grpo import window_range  # torch: imported only for a flow_grpo recipe

    key = f"actor.model.{cfg.actor.model.model_type}"
    family = cfg.actor.model[cfg.actor.model.model_type]
    if family.train_sampler != "euler":
        _fail(f"{key}.train_sampler={family.train_sampler!r} but algorithm.name=flow_grpo samples with Euler(-Maruyama) "
              f"steps (SDE on the trained steps, Euler elsewhere); set {key}.train_sampler=euler")
    if guidance.passes > 1:
        _fail(f"{key}.guidance_scale={family.guidance_scale} but algorithm.name=flow_grpo trains without classifier-free "
              f"guidance (its loss recomputes the sampled step's unguided log-probability); set {key}.guidance_scale=1")
    if alg.adv_type != "grpo":
        _fail(f"algorithm.adv_type={alg.adv_type!r} but algorithm.name=flow_grpo takes one advantage per sample; use "
              f"algorithm.adv_type=grpo")
    size, steps = alg.flow_grpo_sde_window_size, family.num_steps
    low, high = window_range(alg.flow_grpo_sde_window_range, steps)
    if size > 0 and not (high <= steps and size <= high - low):
        _fail(f"algorithm.flow_grpo_sde_window_size={size} in algorithm.flow_grpo_sde_window_range=[{low}, {high}] does "
              f"not fit {key}.num_steps={steps}; the window of steps must lie within [0, {steps}] (null: the first half)")


def _check_awm(cfg: DictConfig) -> None:
    """AWM's sampler band (rlrunner.algorithms.awm.awm_band_index) holds at least one noise level below 1."""
    alg = cfg.algorithm
    if alg.name != "awm" or alg.awm_timesteps != "sampler":
        return
    family_key = f"actor.model.{cfg.actor.model.model_type}"
    steps = cfg.actor.model[cfg.actor.model.model_type].num_steps
    if steps < 2 or int(steps * alg.awm_timestep_fraction) < 1:
        _fail(f"algorithm.awm_timesteps=sampler trains on the sampler's sigmas 1 <= k < int({family_key}.num_steps x "
              f"algorithm.awm_timestep_fraction) = int({steps} x {alg.awm_timestep_fraction}); use num_steps >= 2 "
              f"and a fraction >= 1/num_steps, or algorithm.awm_timesteps=uniform")


def _check_resume(cfg: DictConfig) -> None:
    allow = cfg.runner.resume_allow_changes
    if isinstance(allow, bool) or (OmegaConf.is_list(allow) and all(isinstance(key, str) for key in allow)):
        return
    _fail(f"runner.resume_allow_changes={allow!r} must be true, false or a list of dotted keys "
          "(e.g. [actor.optim.lr]) that may differ from the checkpoint's recipe")


def _check_logger(cfg: DictConfig) -> None:
    """Each tracker in runner.logger.logger_backends is installed: found here, before any worker starts."""
    from rlrunner.tracking.backends import install_hint, missing

    absent = missing(list(cfg.runner.logger.logger_backends))
    if absent:
        _fail(install_hint(absent[0]))


def _check_model(cfg: DictConfig) -> None:
    """A model is named; whether its folder exists is the path table's check (rlrunner.config.paths)."""
    if not cfg.actor.model.model_path:
        _fail("actor.model.model_path is empty; set it to a local diffusers folder or a hub id "
              "(e.g. actor.model.model_path=stabilityai/stable-diffusion-3.5-medium)")


def _reward_parts(cfg: DictConfig, split: str) -> list[tuple[str, dict[str, Any]]]:
    """``(key prefix, keys)`` of each reward the split computes: the reward itself, or each part of a multi reward
    with the keys it inherits from its parent."""
    reward = OmegaConf.to_container(cfg.env[split].reward, resolve=True)
    prefix = f"env.{split}.reward"
    if reward["type"] != "multi":
        return [(prefix, reward)]
    inherited = {key: value for key, value in reward.items() if key not in ("type", "rewards")}
    return [(f"{prefix}.rewards[{i}]", {**inherited, **part}) for i, part in enumerate(reward["rewards"])]


def _check_video(cfg: DictConfig, parts: list[tuple[str, dict[str, Any]]]) -> None:
    """A video recipe's frames, advantages and rewards agree: num_frames > 1 needs adv_type grpo_video and rewards
    that score frames, chunked into exactly the latent frames the advantages are given to."""
    from rlrunner.rewards.frames import num_chunks

    family_key = f"actor.model.{cfg.actor.model.model_type}"
    frames = cfg.actor.model[cfg.actor.model.model_type].num_frames
    adv_type = cfg.algorithm.adv_type
    video = frames > 1
    if video != (adv_type == "grpo_video"):
        wanted = "grpo_video" if video else "grpo"
        _fail(f"algorithm.adv_type={adv_type!r} does not fit {family_key}.num_frames={frames}; use "
              f"algorithm.adv_type={wanted} (grpo_video gives one advantage per latent frame of a video)")
    for key, part in parts:
        wrong = IMAGE_ONLY_REWARDS if video else VIDEO_ONLY_REWARDS
        if part["model"] in wrong:
            kind = "images" if video else "videos"
            _fail(f"{key}.model={part['model']!r} scores {kind} only, but {family_key}.num_frames={frames}; use "
                  f"{'video_ocr' if video else 'ocr'}")
        latent_frames = 1 + (frames - 1) // 4  # the 4x temporal VAE of the video families (num_frames = 4k + 1)
        if video and num_chunks(frames, part["frame_interval"]) != latent_frames:
            _fail(f"{key}.frame_interval={part['frame_interval']} gives {num_chunks(frames, part['frame_interval'])} "
                  f"chunk rewards for {family_key}.num_frames={frames}, which has {latent_frames} latent frames; "
                  f"use frame_interval=4")


def _check_env(cfg: DictConfig, split: str, base_dir: Path, check_datasets: bool) -> None:
    env = cfg.env[split]
    group_size = cfg.algorithm.group_size
    if split == "train" and env.total_num_envs % group_size:
        _fail(f"env.train.total_num_envs={env.total_num_envs} is not a multiple of algorithm.group_size="
              f"{group_size}; use e.g. {max(1, env.total_num_envs // group_size) * group_size}")
    if not check_datasets:
        return
    from rlrunner.data.prompts import FORMATS, load_prompt_set

    if not env.dataset.path:
        _fail(f"env.{split}.dataset.path is empty; set it to a directory with {env.dataset.split}.txt or a "
              f"{' / '.join(FORMATS)} file")
    path = base_dir / Path(env.dataset.path).expanduser()  # absolute, and there (rlrunner.config.paths)
    names = [f"{env.dataset.split}{suffix}" for suffix in FORMATS]
    if path.is_dir() and not any((path / name).is_file() for name in names):
        source = path / "SOURCE.md"
        hint = f"; {source} says where to get it" if source.is_file() else ""
        _fail(f"env.{split}.dataset.path={env.dataset.path!r} has no {' / '.join(names)} "
              f"(env.{split}.dataset.split={env.dataset.split!r}); found: "
              f"{sorted(p.name for p in path.iterdir() if p.suffix in FORMATS) or 'no prompt files'}{hint}")
    try:  # read here, so a malformed file stops the recipe before any worker starts
        prompts = load_prompt_set(path, env.dataset.split, env.dataset.prompt_key)
    except (ValueError, TypeError, ImportError) as err:
        _fail(f"env.{split}.dataset.path={env.dataset.path!r}: {err}")
    if any(part["model"] == "geneval" for _, part in _reward_parts(cfg, split)):
        _check_geneval_records(f"env.{split}.dataset.path={env.dataset.path!r}", prompts)


def _check_geneval_records(where: str, prompts: Any) -> None:
    """``reward.model=geneval`` scores each prompt against its GenEval record; without one it could only score 0."""
    from rlrunner.rewards.geneval.scoring import check_metadata

    for prompt, record in zip(prompts.prompts, prompts.metadata):
        if problem := check_metadata(record):
            _fail(f"{where}: prompt {prompt[:60]!r}: {problem}; reward.model=geneval needs a .jsonl (or .parquet) "
                  f"of GenEval records (tag, include, exclude), e.g. examples/diffusion/data/geneval/test.jsonl")


def _check_reward(cfg: DictConfig, split: str, ctx: Context) -> list[tuple[str, dict[str, Any]]]:
    """Each part of a multi reward passes the reward keys' checks; service rewards have the keys they need."""
    parts = _reward_parts(cfg, split)
    for key, part in parts:
        if cfg.env[split].reward.type == "multi":
            for problem in reward_part_problems(key, part, ctx):
                _fail(problem)
        for needed in REWARD_NEEDS.get(part["model"], ()):
            if not part.get(needed):
                _fail(f"{key}.{needed} is empty; reward.model={part['model']} needs it (see README, Rewards)")
    return parts


def _check_batches(cfg: DictConfig, num_actor_workers: int) -> None:
    actor = cfg.actor
    cp = actor.context_parallel_size
    if num_actor_workers % cp:
        _fail(f"actor.context_parallel_size={cp} does not divide the {num_actor_workers} actor devices into whole "
              f"context-parallel groups")
    groups = num_actor_workers // cp  # a context-parallel group trains the same samples on all its devices
    step = actor.micro_batch_size * groups
    if actor.global_batch_size % step:
        _fail(f"actor.global_batch_size={actor.global_batch_size} is not divisible by actor.micro_batch_size="
              f"{actor.micro_batch_size} x {groups} actor worker group(s) = {step}")
    samples = cfg.env.train.total_num_envs * cfg.env.train.rollout_epoch
    if samples % actor.global_batch_size:
        _fail(f"one step rolls out env.train.total_num_envs x rollout_epoch = {samples} samples, not a multiple "
              f"of actor.global_batch_size={actor.global_batch_size}")


def validate(cfg: DictConfig, base_dir: Path, check_datasets: bool = True) -> None:
    """Reject contradictory or impossible recipes; ``base_dir`` anchors relative paths.

    First every key on its own (:data:`rlrunner.config.checks.KEY_CHECKS`), then the checks across keys.
    ``check_datasets=False`` skips the prompt files (``rlrunner.commands.plan`` sizes a run without reading prompts).
    """
    from rlrunner.cluster import detect_devices_per_node, parse_placement

    ctx = Context(base_dir=base_dir)
    for problem in problems(cfg, ctx):
        _fail(problem)
    _check_algorithm(cfg)
    _check_awm(cfg)
    _check_resume(cfg)
    _check_model(cfg)
    guidance = check_family(cfg, base_dir)
    _check_flow_grpo(cfg, guidance)
    _check_logger(cfg)
    _check_env(cfg, "train", base_dir, check_datasets)
    _check_env(cfg, "eval", base_dir, check_datasets)
    train_parts = _check_reward(cfg, "train", ctx)
    _check_video(cfg, train_parts)
    _check_video(cfg, _check_reward(cfg, "eval", ctx))
    check_context_parallel(cfg, base_dir)
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
    return not joins_cluster(cluster) or cluster.num_devices_per_node > 0


def check_placement(cfg: DictConfig, placement: Any) -> None:
    """Checks that need the placement (a :class:`~rlrunner.cluster.Placement`): batch and prompt shares."""
    _check_batches(cfg, placement.num_workers("actor"))
    if cfg.runner.rollout_ahead and cfg.cluster.enable_offload and placement.is_collocated("actor", "rollout"):
        _fail("runner.rollout_ahead=true needs the actor and rollout models on the device at the same time; it "
              "cannot be combined with cluster.enable_offload for collocated actor and rollout")
    prompts_per_epoch = cfg.env.train.total_num_envs // cfg.algorithm.group_size
    rollout_cp, rollout_devices = cfg.rollout.context_parallel_size, placement.num_workers("rollout")
    if rollout_devices % rollout_cp:
        _fail(f"rollout.context_parallel_size={rollout_cp} does not divide the {rollout_devices} rollout devices into "
              f"whole groups")
    shards = rollout_devices // rollout_cp  # a rollout group samples one shard together
    if prompts_per_epoch % shards:
        _fail(f"env.train.total_num_envs / algorithm.group_size = {prompts_per_epoch} prompts per rollout epoch "
              f"cannot be shared evenly by {shards} rollout worker group(s)")
    # held-out prompts are shared unevenly when they must be (Runner: _split), but every worker needs one
    if cfg.env.eval.total_num_envs < shards:
        _fail(f"env.eval.total_num_envs={cfg.env.eval.total_num_envs} is fewer than the {shards} rollout worker "
              f"group(s); evaluate at least one prompt per group")
