"""The reward interface and registry, and the one schema every reward reads (the recipe's ``RewardConfig``).

    reward = build_reward(cfg)                # cfg: the ``env.*.reward`` sub-config (or a mapping of its keys)
    out = reward(images, prompts)             # images: uint8 [B, H, W, 3] or frames [B, F, H, W, 3]
    out.avg                                   # float32 [B] (image rewards) or [B, K] (video chunk rewards)

Rewards read :class:`rlrunner.config.schema.RewardConfig` (``self.spec``), whatever they were built from: a
recipe's DictConfig, a mapping (tests, ``serve_reward --set``) or a ``RewardConfig``. Missing keys take the
schema's defaults, so a reward has no defaults of its own.

The in-tree rewards register with :func:`register_reward` when ``rlrunner.rewards`` imports their modules; other
packages add rewards through entry points of group ``rlrunner.rewards`` (:func:`load_reward_plugins`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import types
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from rlrunner.config.schema import RewardConfig
from rlrunner.utils.plugins import load_entry_points

from .output import RewardOutput

logger = logging.getLogger(__name__)

#: keys a ``multi`` part does not inherit from its parent
_NOT_INHERITED = ("type", "weight", "rewards")


def reward_config(cfg: Any, strict: bool = False) -> RewardConfig:
    """``cfg`` (a DictConfig, a mapping, a ``RewardConfig`` or an object with its attributes) as a checked
    ``RewardConfig``.

    Missing (or null) keys take the schema's defaults. With ``strict`` (user-written multi parts) an unknown key
    is a ValueError naming it; values are checked by :func:`check_reward_config`.
    """
    if isinstance(cfg, RewardConfig):
        check_reward_config(cfg)
        return cfg
    values = _to_dict(cfg)
    names = [f.name for f in dataclasses.fields(RewardConfig)]
    if strict:
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"Unknown reward key(s) {unknown} in {values}; valid keys: {names}")
    kwargs = {k: values[k] for k in names if k in values and values[k] is not None}
    kwargs["rewards"] = [_to_dict(part) for part in kwargs.get("rewards", ())]
    config = RewardConfig(**kwargs)
    check_reward_config(config)
    return config


def check_reward_config(cfg: RewardConfig) -> None:
    """Value checks with messages that name the bad value."""
    if cfg.batch_size < 1:
        raise ValueError(f"reward.batch_size must be >= 1, got {cfg.batch_size}")
    if cfg.num_workers < 1:
        raise ValueError(f"reward.num_workers must be >= 1, got {cfg.num_workers}")
    if not np.isfinite(cfg.weight) or cfg.weight < 0:
        raise ValueError(f"reward.weight must be a finite number >= 0, got {cfg.weight}")
    if not cfg.timeout_s > 0:
        raise ValueError(f"reward.timeout_s must be > 0, got {cfg.timeout_s}")
    if cfg.max_engine_rebuilds < 0:
        raise ValueError(f"reward.max_engine_rebuilds must be >= 0, got {cfg.max_engine_rebuilds}")
    if cfg.max_retries < 0:
        raise ValueError(f"reward.max_retries must be >= 0, got {cfg.max_retries}")
    if not 1 <= cfg.top_logprobs <= 20:
        raise ValueError(f"reward.top_logprobs must be in 1..20 (the OpenAI API's range), got {cfg.top_logprobs}")
    if cfg.max_concurrency < 1:
        raise ValueError(f"reward.max_concurrency must be >= 1, got {cfg.max_concurrency}")


def part_config(parent: RewardConfig, part: Mapping[str, Any]) -> RewardConfig:
    """The config of one ``multi`` part: the parent's keys (except type, weight, rewards) overridden by the part's."""
    override = reward_config(part, strict=True)  # checks names and values
    if "model" not in part:
        raise ValueError(f"Each entry of reward.rewards needs a 'model' key; got {dict(part)}")
    inherited = {f.name: getattr(parent, f.name) for f in dataclasses.fields(parent) if f.name not in _NOT_INHERITED}
    inherited.update({k: getattr(override, k) for k in part})
    return reward_config(RewardConfig(**inherited))


def _to_dict(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        return {}
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    if isinstance(cfg, Mapping):
        return dict(cfg)
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(RewardConfig) if hasattr(cfg, f.name)}


class Reward(ABC):
    """Base class. Subclasses implement ``__call__``; they must be thread-safe (the async scorer may call one
    instance from several threads) and picklable (the cluster layer may ship one to another process)."""

    #: Registered name; also the key of this reward's entry in ``RewardOutput.parts``.
    name: str = ""
    #: True: ``__call__`` also takes ``metadata``, one dict per sample (the prompt's record of a .jsonl or .parquet
    #: dataset, ``{}`` when it has none); see :func:`score`.
    uses_metadata: bool = False
    #: reward keys this reward cannot do without: the recipe check refuses an empty one before any worker starts
    #: (rlrunner.rewards.checks), and the reward's constructor says what to put there
    needs: tuple[str, ...] = ()

    def __init__(self, spec: RewardConfig) -> None:
        self.spec = spec  # the recipe's reward sub-config, read by the subclasses
        self._logged_reasons: set[str] = set()
        self._log_lock = threading.Lock()

    @abstractmethod
    def __call__(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        """Score a batch.

        Args:
            images: uint8 (or float in [0, 1]) ``[B, H, W, 3]`` images, or ``[B, F, H, W, 3]`` frames for video.
            prompts: ``B`` prompts.
        """

    @classmethod
    def device_memory(cls, spec: RewardConfig) -> list[tuple[str, int, str]]:
        """``(name, bytes, detail)`` of each model this reward would hold on the env worker's device, from config
        files alone (``python -m rlrunner.commands.plan``); bytes < 0 means not counted (``detail`` says why)."""
        return []

    def warn_once(self, reason: str, detail: str) -> None:
        """Log a scoring problem the first time this reward meets ``reason``."""
        with self._log_lock:
            if reason in self._logged_reasons:
                return
            self._logged_reasons.add(reason)
        logger.warning(
            "%s reward: %s; such images get reward 0 and are counted in env/reward_errors "
            "(this warning is shown once per reason)",
            self.name,
            detail,
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_log_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._log_lock = threading.Lock()


def score(reward: Reward, images: np.ndarray, prompts: list[str],
          metadata: list[dict[str, Any]] | None = None) -> RewardOutput:
    """``reward(images, prompts)``, with ``metadata`` (``{}`` per sample when None) for a reward that asks for it."""
    if not reward.uses_metadata:
        return reward(images, prompts)
    return reward(images, prompts, metadata=metadata or [{} for _ in prompts])


class RewardUnavailable(RuntimeError):
    """A required reward cannot score at all (its service is unreachable or refuses us); the message is one line."""


RewardBuilder = Callable[[RewardConfig], Reward]
REWARDS: dict[str, RewardBuilder] = {}
REWARD_TYPES: dict[str, RewardBuilder] = {}


def register_reward(name: str) -> Callable[[RewardBuilder], RewardBuilder]:
    """Decorator: make ``reward.model: <name>`` build this class (or factory) from a ``RewardConfig``; a
    :class:`Reward` class is given that ``name`` (its part's name in ``RewardOutput.parts`` and the logs)."""

    def wrap(builder: RewardBuilder) -> RewardBuilder:
        if name in REWARDS:
            raise ValueError(f"Reward {name!r} is already registered")
        if isinstance(builder, type) and issubclass(builder, Reward):
            builder.name = name
        REWARDS[name] = builder
        return builder

    return wrap


def register_reward_type(name: str) -> Callable[[RewardBuilder], RewardBuilder]:
    """Decorator: make ``reward.type: <name>`` build with this factory."""

    def wrap(builder: RewardBuilder) -> RewardBuilder:
        REWARD_TYPES[name] = builder
        return builder

    return wrap


REWARD_GROUP = "rlrunner.rewards"
#: entry point name -> the one line printed when that reward plugin failed to load
BROKEN_REWARDS: dict[str, str] = {}


def _run_registration(name: str, target: Any) -> None:
    """An entry point's module registered its rewards on import; a callable registers them when called."""
    if isinstance(target, types.ModuleType):
        return
    if not callable(target):
        raise TypeError(f"expected a module or a callable that registers rewards, got {target!r}")
    target()


def load_reward_plugins() -> None:
    """Load the rewards other packages declare, in their pyproject.toml:

        [project.entry-points."rlrunner.rewards"]
        my_rewards = "my_package.rewards"               # a module whose import runs @register_reward("...")
        more = "my_package.rewards:register_all"        # or a callable that registers them, called once

    One that fails to import (or registers a name already taken) is one line on stderr (group, name, value,
    error) and is named when a recipe asks for a reward nobody registered; the other rewards are unaffected."""
    BROKEN_REWARDS.update(load_entry_points(REWARD_GROUP, _run_registration)[1])


@register_reward_type("single")
def build_single(cfg: RewardConfig) -> Reward:
    """``type: single``: the reward registered as ``cfg.model``."""
    if cfg.model not in REWARDS:
        failed = f"; reward plugins that failed to load: {', '.join(BROKEN_REWARDS.values())}" if BROKEN_REWARDS else ""
        raise ValueError(f"Unknown reward.model {cfg.model!r}; valid names: {sorted(REWARDS)}{failed}")
    return REWARDS[cfg.model](cfg)


def build_reward(cfg: Any) -> Reward:
    """Build the reward named by ``cfg.type`` / ``cfg.model`` (a DictConfig, mapping or :class:`RewardConfig`)."""
    cfg = reward_config(cfg)
    if cfg.type not in REWARD_TYPES:
        raise ValueError(f"Unknown reward.type {cfg.type!r}; valid types: {sorted(REWARD_TYPES)}")
    return REWARD_TYPES[cfg.type](cfg)
