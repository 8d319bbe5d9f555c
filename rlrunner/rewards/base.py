"""Reward interface, reward registry, config normalisation and input checks shared by all rewards.

A reward maps decoded pixels and their prompts to per-sample scores:

    reward = build_reward(cfg)                # cfg: the ``env.*.reward`` sub-config
    out = reward(images, prompts)             # images: uint8 [B, H, W, 3] or frames [B, F, H, W, 3]
    out.avg                                   # float32 [B] (image rewards) or [B, K] (video chunk rewards)

Bad inputs never raise inside ``__call__``: an image that cannot be scored gets 0, is counted in
``RewardOutput.errors`` and its reason is logged once per reward instance.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: Images whose shorter side is below this many pixels are not scored (reward 0, counted as an error).
MIN_SIDE = 8
#: Images whose pixel values all lie within this range (max − min, uint8 units) are "blank".
BLANK_RANGE = 2


@dataclass
class RewardOutput:
    """What every reward returns.

    Attributes:
        avg: float32 ``[B]`` for image rewards or ``[B, K]`` chunk rewards for video rewards; the training signal.
        parts: per-part, per-sample scores, each float32 ``[B]`` (e.g. ``{"ocr": ..., "image_stats": ...}``).
        errors: number of images (video: frames) scored 0 because of bad input or an engine failure.
        extra: logging material, e.g. ``texts`` (recognised text per image), ``frame_scores`` ``[B, F]``,
            ``error_mask`` (bool ``[B]`` or ``[B, F]``), ``error_reasons`` (reason -> count).
        failure: empty unless no sample of the batch could be scored (every image erred, or a required reward
            service failed for all of them); then one line saying why. The runner stops after
            ``runner.max_reward_error_steps`` such steps in a row.
    """

    avg: np.ndarray
    parts: dict[str, np.ndarray] = field(default_factory=dict)
    errors: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    failure: str = ""

    @staticmethod
    def concat(outputs: list[RewardOutput]) -> RewardOutput:
        """Join outputs of consecutive sample ranges along the batch axis (used by the async scorer)."""
        if len(outputs) == 1:
            return outputs[0]
        first = outputs[0]
        extra: dict[str, Any] = {}
        for key, value in first.extra.items():
            if any(key not in o.extra for o in outputs):
                continue
            values = [o.extra[key] for o in outputs]
            if isinstance(value, np.ndarray):
                extra[key] = np.concatenate(values, axis=0)
            elif isinstance(value, list):
                extra[key] = [item for v in values for item in v]
            elif isinstance(value, dict):
                extra[key] = _sum_counts(values)
            else:
                extra[key] = value
        return RewardOutput(
            avg=np.concatenate([o.avg for o in outputs], axis=0),
            parts={
                k: np.concatenate([o.parts[k] for o in outputs], axis=0)
                for k in first.parts
                if all(k in o.parts for o in outputs)
            },
            errors=sum(o.errors for o in outputs),
            extra=extra,
            failure=outputs[-1].failure if all(o.failure for o in outputs) else "",
        )


def _sum_counts(counts: list[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return total


@dataclass(frozen=True)
class RewardSpec:
    """The reward sub-config, normalised. Field names and defaults are the recipe schema's (``env.*.reward``).

    ``rewards`` holds the part specs of ``type: multi``; each part dict inherits every key it does not set
    from its parent (except ``type``, ``model``, ``weight`` and ``rewards``).
    """

    type: str = "single"
    model: str = "ocr"
    engine: str = "auto"
    use_gpu: bool = False
    lang: str = "en"
    rec_only: bool = False
    frame_interval: int = 4
    batch_size: int = 16
    num_workers: int = 1
    weight: float = 1.0
    alphabet: str = ""
    rewards: tuple[Mapping[str, Any], ...] = ()
    key: str = "ocr"  # RLinf's name for the reward's output key; accepted, unused
    # reward services (``remote``, ``vlm_ocr``; rewards/service.py)
    url: str = ""
    token_file: str = ""
    base_url: str = ""
    served_model: str = ""
    api_key_file: str = ""
    timeout_s: float = 60.0
    max_retries: int = 3
    max_concurrency: int = 4
    required: bool = True

    @classmethod
    def from_cfg(cls, cfg: Any, strict: bool = False) -> RewardSpec:
        """Read a DictConfig, a mapping or any object with the schema's attributes.

        Missing keys take the defaults. With ``strict`` (user-written multi parts) an unknown key is a ValueError.
        """
        if isinstance(cfg, RewardSpec):
            return cfg
        values = _to_dict(cfg)
        names = [f.name for f in dataclasses.fields(cls)]
        if strict:
            unknown = sorted(set(values) - set(names))
            if unknown:
                raise ValueError(f"Unknown reward key(s) {unknown} in {values}; valid keys: {names}")
        kwargs = {k: values[k] for k in names if k in values and values[k] is not None}
        kwargs["rewards"] = tuple(_to_dict(r) for r in kwargs.get("rewards", ()))
        spec = cls(**kwargs)
        spec.validate()
        return spec

    def validate(self) -> None:
        """Cross-field checks with messages that name the bad value."""
        if self.batch_size < 1:
            raise ValueError(f"reward.batch_size must be >= 1, got {self.batch_size}")
        if self.num_workers < 1:
            raise ValueError(f"reward.num_workers must be >= 1, got {self.num_workers}")
        if not np.isfinite(self.weight) or self.weight < 0:
            raise ValueError(f"reward.weight must be a finite number >= 0, got {self.weight}")
        if not self.timeout_s > 0:
            raise ValueError(f"reward.timeout_s must be > 0, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"reward.max_retries must be >= 0, got {self.max_retries}")
        if self.max_concurrency < 1:
            raise ValueError(f"reward.max_concurrency must be >= 1, got {self.max_concurrency}")

    def child(self, part: Mapping[str, Any]) -> RewardSpec:
        """The spec of one ``multi`` part: the parent's keys overridden by the part's own."""
        override = RewardSpec.from_cfg(part, strict=True)  # validates names and values
        if "model" not in part:
            raise ValueError(f"Each entry of reward.rewards needs a 'model' key; got {dict(part)}")
        inherited = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        inherited.update(type="single", weight=1.0, rewards=())
        inherited.update({k: getattr(override, k) for k in part})
        spec = RewardSpec(**inherited)
        spec.validate()
        return spec


def _to_dict(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        return {}
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except ImportError:  # pragma: no cover - omegaconf is a core dependency
        pass
    if isinstance(cfg, Mapping):
        return dict(cfg)
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(RewardSpec) if hasattr(cfg, f.name)}


class Reward(ABC):
    """Base class. Subclasses implement ``__call__``; they must be thread-safe (the async scorer may call one
    instance from several threads) and picklable (the cluster layer may ship one to another process)."""

    #: Registered name; also the key of this reward's entry in ``RewardOutput.parts``.
    name: str = ""

    def __init__(self, spec: RewardSpec) -> None:
        self.spec = spec
        self._logged_reasons: set[str] = set()
        self._log_lock = threading.Lock()

    @abstractmethod
    def __call__(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        """Score a batch.

        Args:
            images: uint8 (or float in [0, 1]) ``[B, H, W, 3]`` images, or ``[B, F, H, W, 3]`` frames for video.
            prompts: ``B`` prompts.
        """

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


class RewardUnavailable(RuntimeError):
    """A required reward cannot score at all (its service is unreachable or refuses us); the message is one line."""


RewardBuilder = Callable[[RewardSpec], Reward]
REWARDS: dict[str, RewardBuilder] = {}
REWARD_TYPES: dict[str, RewardBuilder] = {}


def register_reward(name: str) -> Callable[[RewardBuilder], RewardBuilder]:
    """Decorator: make ``reward.model: <name>`` build this class (or factory) from a ``RewardSpec``."""

    def wrap(builder: RewardBuilder) -> RewardBuilder:
        if name in REWARDS:
            raise ValueError(f"Reward {name!r} is already registered")
        REWARDS[name] = builder
        return builder

    return wrap


def register_reward_type(name: str) -> Callable[[RewardBuilder], RewardBuilder]:
    """Decorator: make ``reward.type: <name>`` build with this factory."""

    def wrap(builder: RewardBuilder) -> RewardBuilder:
        REWARD_TYPES[name] = builder
        return builder

    return wrap


@register_reward_type("single")
def build_single(spec: RewardSpec) -> Reward:
    """``type: single``: the reward registered as ``spec.model``."""
    if spec.model not in REWARDS:
        raise ValueError(f"Unknown reward.model {spec.model!r}; valid names: {sorted(REWARDS)}")
    return REWARDS[spec.model](spec)


def build_reward(cfg: Any) -> Reward:
    """Build the reward named by ``cfg.type`` / ``cfg.model`` (a DictConfig, mapping or attribute object)."""
    spec = RewardSpec.from_cfg(cfg)
    if spec.type not in REWARD_TYPES:
        raise ValueError(f"Unknown reward.type {spec.type!r}; valid types: {sorted(REWARD_TYPES)}")
    return REWARD_TYPES[spec.type](spec)


def as_uint8(images: np.ndarray, frame_axes: int) -> tuple[np.ndarray, list[str | None]]:
    """Check a batch at the boundary and convert it to uint8.

    Args:
        images: ``[B, H, W, 3]`` (``frame_axes=0``) or ``[B, F, H, W, 3]`` (``frame_axes=1``); uint8, or float
            in [0, 1] (diffusers' ``output_type="np"``). 1 (gray) or 4 (RGBA) channels are accepted too.
        frame_axes: number of axes between batch and pixels.

    Returns:
        ``(uint8 [N, H, W, 3] with N = B·F, reasons)``: ``reasons[i]`` is why image ``i`` cannot be scored
        (non-finite pixels, too small), or None. Non-finite pixels become 0 in the returned array.

    Raises:
        ValueError/TypeError for a batch of the wrong rank or dtype (a caller bug, not bad data).
    """
    images = np.asarray(images)
    rank = 4 + frame_axes
    if images.ndim != rank or images.shape[-1] not in (1, 3, 4):
        layout = "[B, H, W, 3]" if frame_axes == 0 else "[B, F, H, W, 3]"
        raise ValueError(f"Expected images shaped {layout}, got shape {images.shape}")
    flat = images.reshape((-1,) + images.shape[-3:])
    reasons: list[str | None] = [None] * flat.shape[0]
    if np.issubdtype(flat.dtype, np.floating):
        finite = np.isfinite(flat).reshape(flat.shape[0], -1).all(axis=1)
        for i in np.flatnonzero(~finite):
            reasons[i] = "non-finite pixels (NaN/inf)"
        flat = np.nan_to_num(flat, nan=0.0, posinf=1.0, neginf=0.0)
        flat = np.clip(np.rint(flat * 255.0), 0, 255).astype(np.uint8)
    elif flat.dtype != np.uint8:
        raise TypeError(f"Expected uint8 or float images, got dtype {flat.dtype}")
    if flat.shape[-1] == 1:
        flat = np.repeat(flat, 3, axis=-1)
    elif flat.shape[-1] == 4:
        flat = np.ascontiguousarray(flat[..., :3])
    if min(flat.shape[1:3]) < MIN_SIDE:
        reasons = [r or f"image smaller than {MIN_SIDE} px ({flat.shape[1]}x{flat.shape[2]})" for r in reasons]
    return flat, reasons


def is_blank(image: np.ndarray) -> bool:
    """True when all pixels of ``image`` (uint8 ``[H, W, 3]``) lie within ``BLANK_RANGE`` of each other."""
    return int(image.max()) - int(image.min()) <= BLANK_RANGE


def check_prompts(prompts: list[str], batch: int) -> list[str]:
    """Validate the prompt list against the batch size; returns it as a list of str."""
    prompts = list(prompts)
    if len(prompts) != batch:
        raise ValueError(f"Got {batch} images but {len(prompts)} prompts")
    bad = [type(p).__name__ for p in prompts if not isinstance(p, str)]
    if bad:
        raise TypeError(f"Prompts must be str, got {bad[:3]}")
    return prompts


def error_summary(reasons: list[str | None]) -> tuple[np.ndarray, dict[str, int]]:
    """``(bool mask [N], reason -> count)`` from per-image reasons (None = no error)."""
    mask = np.array([r is not None for r in reasons], dtype=bool)
    counts: dict[str, int] = {}
    for r in reasons:
        if r is not None:
            key = reason_key(r)
            counts[key] = counts.get(key, 0) + 1
    return mask, counts


def all_failed(reasons: list[str | None]) -> str:
    """``RewardOutput.failure`` for per-image ``reasons``: empty unless every image has one."""
    if not reasons or any(r is None for r in reasons):
        return ""
    return f"all {len(reasons)} images were unscorable; the last one: {reasons[-1]}"


def reason_key(reason: str) -> str:
    """The short key of a reason: text before the first ' (' or ':' (details vary, keys do not)."""
    return reason.split(" (")[0].split(":")[0]
