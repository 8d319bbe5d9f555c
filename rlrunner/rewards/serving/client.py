"""Rewards computed by an HTTP service: the client (timeouts, retries, concurrency) and the shared reward logic.

``ServiceClient`` posts JSON with a bearer token, a timeout per attempt, and up to ``max_retries`` retries of
transient failures (connection errors, timeouts, HTTP 429/5xx) after an exponential backoff with full jitter;
other answers (400, 401, 413, a malformed body) fail at once. At most ``max_concurrency`` requests are in flight.

``ServiceReward`` turns images ``[B, H, W, 3]`` or frames ``[B, F, H, W, 3]`` into requests (subclasses say how:
``serving/remote.py``, ``ocr/vlm.py``, ``judges/judge.py``, ``geneval/reward.py``) and back into a
``RewardOutput``: frame scores are chunked like ``video_ocr``; an image whose request finally failed scores 0
and counts in ``errors``. With ``required: true`` such failures make ``RewardOutput.failure`` non-empty when they
hit every sample (the runner then stops after ``runner.max_reward_error_steps`` steps); with ``required: false``
they are only counted.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from rlrunner.config.schema import RewardConfig

from ..frames import chunk_frame_scores
from ..inputs import all_failed, as_uint8, check_prompts, error_summary, reason_key
from ..output import RewardOutput
from ..registry import Reward, RewardUnavailable

#: First backoff (seconds) and its cap; attempt ``k`` waits ``uniform(0, min(cap, base * 2**k))``.
BACKOFF_BASE_S = 0.2
BACKOFF_CAP_S = 10.0
#: HTTP statuses worth retrying: the server is overloaded or restarting.
RETRY_STATUSES = (429, 500, 502, 503, 504)
#: Reason given to images whose request failed (the text before " (" is the key counted in error_reasons).
UNAVAILABLE = "reward service unavailable"

T = TypeVar("T")


class ServiceError(RuntimeError):
    """A request that finally failed; the message is one line naming the URL and the last error."""


def read_secret(path: str, key: str) -> str:
    """The stripped content of the file at ``path`` (``key`` names the recipe key in errors); "" for no path."""
    if not path:
        return ""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"{key}={path!r} does not exist; write the token into that file")
    secret = file.read_text().strip()
    if not secret:
        raise ValueError(f"{key}={path!r} is empty; write the token into that file")
    return secret


class ServiceClient:
    """JSON over HTTP to one service with retries; thread-safe, picklable (sessions and threads are rebuilt)."""

    def __init__(self, token: str, timeout_s: float, max_retries: int, max_concurrency: int) -> None:
        self.token, self.timeout_s = token, timeout_s
        self.max_retries, self.max_concurrency = max_retries, max_concurrency
        self._setup()

    def _setup(self) -> None:
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="reward-http")
        self._jitter = random.Random()  # private: retries must not move the global RNG that seeds training

    def _session(self) -> Any:
        import requests

        if not hasattr(self._local, "session"):  # one keep-alive session per thread (Session is not thread-safe)
            self._local.session = requests.Session()
        return self._local.session

    def request(self, method: str, url: str, payload: Any = None) -> Any:
        """The decoded JSON answer of ``method url`` (with ``payload`` as JSON body); ServiceError when it fails."""
        import requests

        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        body = None if payload is None else json.dumps(payload)
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self._jitter.uniform(0.0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (attempt - 1))))
            try:
                response = self._session().request(method, url, data=body, headers=headers, timeout=self.timeout_s)
            except requests.Timeout:
                last = f"no answer within timeout_s={self.timeout_s}"
                continue
            except requests.RequestException as err:
                last = _short_error(err)
                continue
            if response.status_code in RETRY_STATUSES:
                last = f"HTTP {response.status_code}: {_error_text(response)}"
                continue
            if response.status_code != 200:
                raise ServiceError(f"{url} answered HTTP {response.status_code}: {_error_text(response)}")
            try:  # stdlib json, not response.json(): requests switches to simplejson when installed, which
                # rejects NaN, and a NaN reward must reach the finite-number check with its own message
                return json.loads(response.content)
            except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's stack
                raise ServiceError(f"{url} answered with a body that is not JSON: {response.text[:120]!r}") from None
        raise ServiceError(f"{url} failed after {self.max_retries + 1} attempt(s): {last}")

    def map(self, fn: Callable[[Any], T], items: Sequence[Any]) -> list[T | ServiceError]:
        """``fn`` over ``items`` with at most ``max_concurrency`` in flight; a ServiceError is returned, not raised."""

        def guarded(item: Any) -> T | ServiceError:
            try:
                return fn(item)
            except ServiceError as err:
                return err

        return list(self._pool.map(guarded, items))

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_local", "_pool", "_jitter")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()


def _error_text(response: Any) -> str:
    """The server's one-line error: the ``error`` field of a JSON body, else the start of the body."""
    try:
        body = json.loads(response.content)
        text = body.get("error") if isinstance(body, dict) else None
    except (ValueError, RecursionError):
        text = None
    return " ".join(str(text or response.text or response.reason).split())[:200]


def _short_error(err: Exception) -> str:
    """``ConnectionError: [Errno 111] Connection refused`` instead of urllib3's nested repr."""
    errno = re.search(r"\[Errno -?\d+\][^'\")]*", str(err))
    return f"{type(err).__name__}: {errno.group(0).strip() if errno else str(err)[:200]}"


@dataclass
class FrameResults:
    """What a service said about ``N = B·F`` images (frames in sample-major order).

    ``scores`` float32 ``[N]``; ``reasons[i]``: why image ``i`` scored 0 (None if it did not); ``unreachable[i]``:
    its request failed (``reasons[i]`` then holds the error); ``extra``: per-image logging lists (e.g. texts).
    """

    scores: np.ndarray
    reasons: list[str | None]
    unreachable: list[bool]
    extra: dict[str, list[Any]] = field(default_factory=dict)


class ServiceReward(Reward):
    """A reward computed by an HTTP service; subclasses implement ``score_frames``.

    A subclass says where its service is, and this class finds, authenticates and (with ``required: true``) probes
    it: ``address_key`` is the recipe key of its address (``url``: a server that speaks rlrunner's protocols;
    ``base_url``: an OpenAI-compatible endpoint, which needs ``served_model`` too), ``secret_key`` the key of the
    file holding its bearer token, ``health_path`` what answers once the service is up, and ``address_hint`` the
    example and pointer that the error for an empty address gives.
    """

    address_key: ClassVar[str] = "url"
    needs = ("url",)  # a base_url endpoint needs ("base_url", "served_model")
    secret_key: ClassVar[str] = "token_file"
    health_path: ClassVar[str] = "/health"
    address_hint: ClassVar[str] = "e.g. http://127.0.0.1:8000"

    def __init__(self, spec: RewardConfig) -> None:
        super().__init__(spec)
        if self.address_key == "base_url":
            if not all(getattr(spec, key) for key in self.needs):
                raise ValueError(f"reward.model={spec.model} needs reward.base_url ({self.address_hint}) and "
                                 f"reward.served_model (the endpoint's model name, as in `vllm serve ... "
                                 f"--served-model-name NAME`)")
        elif not getattr(spec, self.address_key):
            raise ValueError(f"reward.model={spec.model} needs reward.{self.address_key}, {self.address_hint}")
        token = read_secret(getattr(spec, self.secret_key), f"reward.{self.secret_key}")
        self.client = ServiceClient(token, spec.timeout_s, spec.max_retries, spec.max_concurrency)
        self.address = getattr(spec, self.address_key).rstrip("/")  # where every request of the subclass goes
        self.check_reachable(f"{self.address}{self.health_path}")

    @abstractmethod
    def score_frames(self, frames: np.ndarray, prompts: list[str], reasons: list[str | None],
                     metadata: list[dict[str, Any]]) -> FrameResults:
        """Score uint8 ``frames`` ``[B, F, H, W, 3]`` (``F = 1`` for images) against ``B`` prompts.

        ``reasons`` (``B·F``) marks frames the client already knows to be unscorable: they must score 0.
        ``metadata``: ``B`` dicts, each prompt's record (``{}`` unless the reward sets ``uses_metadata``).
        """

    def check_reachable(self, url: str) -> None:
        """With ``required: true``, fail now (before any rollout) when ``url`` does not answer."""
        if not self.spec.required:
            return
        try:
            self.client.request("GET", url)
        except ServiceError as err:
            raise RewardUnavailable(f"reward.model={self.spec.model} (required) cannot reach its service: {err}; "
                                    f"start it first, or set reward.required=false to train on without it") from None

    def __call__(self, images: np.ndarray, prompts: list[str],
                 metadata: list[dict[str, Any]] | None = None) -> RewardOutput:
        images = np.asarray(images)
        video = images.ndim == 5
        flat, reasons = as_uint8(images, frame_axes=int(video))
        num_frames = images.shape[1] if video else 1
        prompts = check_prompts(prompts, flat.shape[0] // num_frames)
        frames = flat.reshape((len(prompts), num_frames) + flat.shape[1:])
        result = self.score_frames(frames, prompts, reasons, metadata or [{} for _ in prompts])
        for r in result.reasons:
            if r is not None:
                self.warn_once(reason_key(r), r)
        scores = result.scores.astype(np.float32).reshape(len(prompts), num_frames)
        mask, counts = error_summary(result.reasons)
        extra: dict[str, Any] = {"error_mask": mask.reshape(scores.shape) if video else mask, "error_reasons": counts}
        for key, values in result.extra.items():
            extra[key] = [values[b * num_frames:(b + 1) * num_frames] for b in range(len(prompts))] if video else values
        if video:
            avg = chunk_frame_scores(scores, self.spec.frame_interval)
            part = avg.mean(axis=1).astype(np.float32)
            extra["frame_scores"] = scores
        else:
            avg, part = scores[:, 0], scores[:, 0].copy()
        return RewardOutput(avg=avg, parts={self.name: part}, errors=int(mask.sum()), extra=extra,
                            failure=self.failure(result))

    def failure(self, result: FrameResults) -> str:
        """Non-empty when no image could be scored; a failed request counts only when the reward is required."""
        fatal = [r is not None and (self.spec.required or not down) for r, down in zip(result.reasons, result.unreachable)]
        if not fatal or not all(fatal):
            return ""
        errors = [r for r, down in zip(result.reasons, result.unreachable) if down]
        return errors[-1] if errors else all_failed(result.reasons)  # a ServiceError names the URL

    @staticmethod
    def unreachable_reason(err: ServiceError) -> str:
        return f"{UNAVAILABLE} ({err})"
