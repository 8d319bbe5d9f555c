"""The checks of the reward keys (``env.<split>.reward.*``, also each part of a multi reward), and across keys: the
keys a reward model cannot do without (:func:`reward_needs`, its class's ``needs``), a video recipe's rewards
agreeing with its frames and advantages, and a GenEval prompt set holding GenEval records. Registered in :mod:`rlrunner.recipe`."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from omegaconf import DictConfig, ListConfig, OmegaConf

from rlrunner.config.check_kinds import (
    COUNT,
    POSITIVE_INT,
    Check,
    Choice,
    Context,
    Free,
    InPathTable,
    Range,
    Rule,
    names,
)
from rlrunner.config.errors import fail as _fail
from rlrunner.rewards.multi import AGGREGATIONS
from rlrunner.rewards.ocr import ENGINES
from rlrunner.rewards.ocr.engines import PADDLE_MODELS
from rlrunner.rewards.registry import REWARD_TYPES, REWARDS
from rlrunner.utils.device import PRECISIONS


def reward_needs(model: str) -> tuple[str, ...]:
    """The reward keys ``reward.model: model`` cannot do without (its class's ``needs``; () for a factory)."""
    return getattr(REWARDS.get(model), "needs", ())

# rewards that score one kind of input only (the others take images [B, H, W, 3] and frames [B, F, H, W, 3])
IMAGE_ONLY_REWARDS = ("ocr", "vlm_ocr")
VIDEO_ONLY_REWARDS = ("video_ocr",)


def _is_url(value: Any) -> bool:
    url = urlsplit(str(value))
    return value == "" or (url.scheme in ("http", "https") and bool(url.hostname))


def _is_reward_parts(parts: Any) -> bool:
    return isinstance(parts, (list, ListConfig)) and all(isinstance(p, (dict, DictConfig)) for p in parts)


_REWARD = {
    "type": Choice(names(REWARD_TYPES)),
    "model": Choice(names(REWARDS)),
    "key": Free("RLinf's name of the reward's output key; not read"),
    "engine": Choice(names(ENGINES, first=("auto",))),
    "use_gpu": Free("bool"),
    "lang": Free("an OCR language code, passed to the engine, which rejects unknown ones when it loads"),
    "ocr_version": Choice(names(PADDLE_MODELS)),
    "rec_only": Free("bool"),
    # >= 1 on every recipe: the video check (_check_video) runs only when num_frames > 1, so a range that
    # let 0 through ("one reward per frame", which never matches a video's latent frames) passed on image recipes
    "frame_interval": Range(low=1, meaning="frames per chunk reward; 4 = the video VAE's temporal compression"),
    "batch_size": POSITIVE_INT,
    "num_workers": POSITIVE_INT,
    "weight": Range(meaning="weight of this part in a multi reward"),
    "alphabet": Free("the characters to keep; any text"),
    "rewards": Rule(_is_reward_parts, "a list of mappings of reward keys (parts of a multi reward)"),
    "aggregation": Choice(names(AGGREGATIONS)),
    "model_path": InPathTable("a local folder/file or a hub id"),
    "processor_path": InPathTable("a local folder or hub id of the tokenizer/processor, or empty (= model_path)"),
    "head_path": InPathTable("a file"),
    "precision": Choice(names(PRECISIONS)),
    "url": Rule(_is_url, "an http(s) URL such as http://127.0.0.1:8000, or empty"),
    "token_file": InPathTable("a file"),
    "base_url": Rule(_is_url, "an http(s) URL such as http://127.0.0.1:8000/v1, or empty"),
    "served_model": Free("the model name the endpoint serves; required for vlm_ocr and the judges (_check_reward)"),
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
KEY_CHECKS: dict[str, Check] = {f"env.<split>.reward.{key}": check for key, check in _REWARD.items()}


def reward_part_problems(prefix: str, part: dict[str, Any], ctx: Context) -> Iterator[str]:
    """The same checks for one part of a multi reward (a plain mapping with the keys it inherits)."""
    for key, value in part.items():
        if key not in _REWARD:
            close = difflib.get_close_matches(key, list(_REWARD), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; valid keys: {', '.join(_REWARD)}"
            yield f"{prefix}.{key} is not a reward key{hint}"
        elif (why := _REWARD[key].problem(value, ctx)) is not None:
            yield f"{prefix}.{key}={value!r} {why}"


def reward_parts(cfg: DictConfig, split: str) -> list[tuple[str, dict[str, Any]]]:
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


def check_geneval_records(where: str, prompts: Any) -> None:
    """``reward.model=geneval`` scores each prompt against its GenEval record; without one it could only score 0."""
    from rlrunner.rewards.geneval.scoring import check_metadata

    for prompt, record in zip(prompts.prompts, prompts.metadata):
        if problem := check_metadata(record):
            _fail(f"{where}: prompt {prompt[:60]!r}: {problem}; reward.model=geneval needs a .jsonl (or .parquet) "
                  f"of GenEval records (tag, include, exclude), e.g. examples/diffusion/data/geneval/test.jsonl")


def _check_reward(cfg: DictConfig, split: str, ctx: Context) -> list[tuple[str, dict[str, Any]]]:
    """Each part of a multi reward passes the reward keys' checks; service rewards have the keys they need."""
    parts = reward_parts(cfg, split)
    for key, part in parts:
        if cfg.env[split].reward.type == "multi":
            for problem in reward_part_problems(key, part, ctx):
                _fail(problem)
        for needed in reward_needs(part["model"]):
            if not part.get(needed):
                _fail(f"{key}.{needed} is empty; reward.model={part['model']} needs it (see docs/rewards.md)")
    return parts


def check_rewards(cfg: DictConfig, ctx: Context) -> None:
    """Each split's rewards pass :func:`_check_reward` and fit a video recipe's frames (:func:`_check_video`)."""
    train_parts = _check_reward(cfg, "train", ctx)
    _check_video(cfg, train_parts)
    _check_video(cfg, _check_reward(cfg, "eval", ctx))
