"""OCR reward: how well the image shows the prompt's quoted text (docs/design.md, "The OCR reward").

Scoring is exactly the official DiffusionNFT / flow_grpo / RLinf rule, as the pure function ``ocr_score``:
target = first double-quoted span of the prompt (whole prompt if none); spaces removed and lowercased in both
target and recognised text (all recognised lines joined); if the target is a substring of the recognised text
the reward is 1, else ``1 − min(Levenshtein(text, target), len(target)) / len(target)``.
One addition: both strings are NFC-normalised, so a composed "é" matches a decomposed one (no change for ASCII).
"""

from __future__ import annotations

import threading
import unicodedata
from typing import Any

import Levenshtein
import numpy as np

from rlrunner.config.schema import RewardConfig

from ..inputs import all_failed, as_uint8, check_prompts, error_summary, is_blank, reason_key
from ..output import RewardOutput
from ..registry import Reward, RewardUnavailable, register_reward
from .engines import MIN_TEXT_SCORE, Line, OcrEngine, build_engine, default_num_threads


def extract_target(prompt: str) -> str:
    """The first double-quoted span of ``prompt`` (text after the first ``"`` if unclosed); the prompt if none."""
    pieces = prompt.split('"')
    return pieces[1] if len(pieces) > 1 else prompt


def normalize_text(text: str) -> str:
    """Spaces removed, lowercased, NFC."""
    return unicodedata.normalize("NFC", text).replace(" ", "").lower()


def filter_alphabet(text: str, alphabet: str) -> str:
    """Keep only characters of ``alphabet`` (case-insensitive); an empty alphabet keeps everything."""
    if not alphabet:
        return text
    allowed = set(alphabet.lower())
    return "".join(c for c in text if c.lower() in allowed)


def join_lines(lines: list[Line], min_score: float = MIN_TEXT_SCORE) -> str:
    """All recognised lines with confidence >= ``min_score``, joined without separator (as the reference)."""
    return "".join(text for text, score in lines if score >= min_score)


def ocr_score(recognized_text: str, prompt: str) -> float:
    """Reward in [0, 1] for recognising ``recognized_text`` in an image generated from ``prompt``.

    Returns 0 for an empty target (the caller counts that as an error).
    """
    target = normalize_text(extract_target(prompt))
    if not target:
        return 0.0
    text = normalize_text(recognized_text)
    if target in text:
        return 1.0
    dist = min(Levenshtein.distance(text, target), len(target))
    return 1.0 - dist / len(target)


def unscorable(images: np.ndarray, prompts: list[str], reasons: list[str | None]) -> list[str | None]:
    """``reasons`` (one per image of uint8 ``[N, H, W, 3]``) plus empty targets and blank images, which score 0."""
    reasons = list(reasons)
    for i, (image, prompt) in enumerate(zip(images, prompts)):
        if reasons[i] is None and not normalize_text(extract_target(prompt)):
            reasons[i] = f"empty target text (prompt {prompt[:60]!r})"
        elif reasons[i] is None and is_blank(image):
            reasons[i] = "blank image (all pixels the same colour)"
    return reasons


def _call_with_timeout(fn: Any, timeout_s: float) -> Any:
    """``fn()`` in a daemon thread (a hung engine must not keep the process alive), given ``timeout_s`` seconds."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as err:  # noqa: BLE001  re-raised in the caller's thread
            outcome["error"] = err

    thread = threading.Thread(target=target, name="ocr-engine-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no answer within reward.timeout_s={timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class EnginePool:
    """Engines for concurrent callers: each call borrows one, a new one is built when all are busy.

    The first engine is built eagerly so that a missing or broken engine fails at ``build_reward`` time. Up to
    ``reward.num_workers`` engines (one per scorer thread) are built as callers need them; an engine built beyond
    that replaces one stuck in a call that hung past ``reward.timeout_s`` (``timeouts`` counts those calls). Such
    rebuilds are bounded by ``reward.max_engine_rebuilds``: the next one raises :class:`RewardUnavailable`,
    which stops the run with one line.
    """

    def __init__(self, spec: RewardConfig) -> None:
        self._kwargs: dict[str, Any] = {
            "lang": spec.lang,
            "use_gpu": spec.use_gpu,
            "num_threads": default_num_threads(spec.num_workers),
            "batch_size": spec.batch_size,
            "ocr_version": spec.ocr_version,
        }
        self._limits = {"concurrency": spec.num_workers, "max_rebuilds": spec.max_engine_rebuilds,
                        "timeout_s": spec.timeout_s}
        engine, self.engine_name = build_engine(spec.engine, **self._kwargs)
        self._free: list[OcrEngine] = [engine]
        self._lock = threading.Lock()
        self.built, self.timeouts = 1, 0

    def run(self, fn_name: str, images: list[np.ndarray], timeout_s: float | None = None) -> Any:
        """Call ``engine.<fn_name>(images)`` on a free engine; raise ``TimeoutError`` after ``timeout_s`` seconds.

        A call that hangs keeps its engine (in a daemon thread) until it returns; later calls build another.
        """
        engine = self._borrow()

        def call() -> Any:
            try:
                return getattr(engine, fn_name)(images)
            finally:
                with self._lock:
                    self._free.append(engine)

        if timeout_s is None:
            return call()
        try:
            return _call_with_timeout(call, timeout_s)
        except TimeoutError:
            with self._lock:
                self.timeouts += 1
            raise

    @property
    def rebuilds(self) -> int:
        """Engines built to replace ones stuck in hung calls."""
        return max(0, self.built - self._limits["concurrency"])

    def _borrow(self) -> OcrEngine:
        with self._lock:
            if self._free:
                return self._free.pop()
            limit = self._limits["max_rebuilds"]
            if self.built >= self._limits["concurrency"] and self.rebuilds >= limit:
                raise RewardUnavailable(
                    f"the {self.engine_name} OCR engine hung {self.timeouts} time(s) past reward.timeout_s="
                    f"{self._limits['timeout_s']:g} s and was rebuilt {self.rebuilds} time(s), the most "
                    f"reward.max_engine_rebuilds={limit} allows; check the engine (its device, its install) or raise "
                    f"reward.timeout_s")
            self.built += 1
        return build_engine(self.engine_name, **self._kwargs)[0]

    def __getstate__(self) -> dict[str, Any]:
        return {"_kwargs": self._kwargs, "_limits": self._limits, "engine_name": self.engine_name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._free, self._lock = [], threading.Lock()
        self.built, self.timeouts = 0, 0


@register_reward("ocr")
class OcrReward(Reward):
    """OCR reward for images.

    Call with uint8 images ``[B, H, W, 3]`` (or float in [0, 1]) and ``B`` prompts; returns ``avg`` float32 ``[B]``,
    ``parts["ocr"]`` (same), ``extra["texts"]`` (recognised text per image, after the alphabet filter),
    ``extra["targets"]``, ``extra["error_mask"]`` bool ``[B]``, ``extra["error_reasons"]`` and
    ``extra["image_errors"]`` (why each image scored 0, or None).

    Config keys used: ``engine``, ``use_gpu``, ``lang``, ``ocr_version`` (the paddleocr engine's models),
    ``rec_only`` (each image is one text line: recognition
    only, no detector), ``batch_size`` (images per engine call), ``num_workers`` (sizes inference threads),
    ``alphabet`` (recognised text filtered to these characters before scoring), ``timeout_s`` (seconds one engine
    call may take; the images of a call past it score 0, counted in ``errors``).
    """

    def __init__(self, spec: RewardConfig, engines: EnginePool | None = None) -> None:
        super().__init__(spec)
        self.engines = engines if engines is not None else EnginePool(spec)

    def __call__(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        flat, reasons = as_uint8(images, frame_axes=0)
        prompts = check_prompts(prompts, flat.shape[0])
        scores, texts, reasons = self.score_images(flat, prompts, reasons)
        mask, counts = error_summary(reasons)
        return RewardOutput(
            avg=scores,
            parts={self.name: scores.copy()},
            errors=int(mask.sum()),
            extra={
                "texts": texts,
                "targets": [extract_target(p) for p in prompts],
                "error_mask": mask,
                "error_reasons": counts,
                "image_errors": reasons,
            },
            failure=all_failed(reasons),
        )

    def score_images(
        self, images: np.ndarray, prompts: list[str], reasons: list[str | None]
    ) -> tuple[np.ndarray, list[str], list[str | None]]:
        """Score uint8 images ``[N, H, W, 3]`` against ``N`` prompts.

        ``reasons[i]`` not None means image ``i`` is already known to be unscorable. Returns float32 scores ``[N]``,
        recognised texts (N) and the updated reasons; every image with a reason scores 0.
        """
        reasons = unscorable(images, prompts, reasons)
        todo = [i for i, r in enumerate(reasons) if r is None]
        texts = [""] * len(images)
        for start in range(0, len(todo), self.spec.batch_size):
            engine_batch = todo[start : start + self.spec.batch_size]
            for i, text in zip(engine_batch, self._recognize([images[i] for i in engine_batch], reasons, engine_batch)):
                texts[i] = filter_alphabet(text, self.spec.alphabet)
        scores = np.zeros(len(images), dtype=np.float32)
        for i, (text, prompt) in enumerate(zip(texts, prompts)):
            if reasons[i] is None:
                scores[i] = ocr_score(text, prompt)
        for r in reasons:
            if r is not None:
                self.warn_once(reason_key(r), r)
        return scores, texts, reasons

    def _recognize(self, images: list[np.ndarray], reasons: list[str | None], index: list[int]) -> list[str]:
        """Recognised text per image; an engine exception is retried image by image to isolate the bad one, a call
        that hangs past ``reward.timeout_s`` is not (every image of it scores 0: retrying would hang as long again)."""
        try:
            return self._read(images)
        except RewardUnavailable:  # the engine rebuild limit: stop the run, not score 0
            raise
        except TimeoutError as err:
            for i in index:
                reasons[i] = f"engine timeout: {err}"
            return [""] * len(images)
        except Exception as err:  # noqa: BLE001  any engine failure must become reward 0, never a crash
            if len(images) == 1:
                reasons[index[0]] = f"engine error: {type(err).__name__}: {err}"
                return [""]
        return [self._recognize([image], reasons, [i])[0] for image, i in zip(images, index)]

    def _read(self, images: list[np.ndarray]) -> list[str]:
        if self.spec.rec_only:
            texts = [join_lines([line]) for line in self.engines.run("read_lines", images, self.spec.timeout_s)]
        else:
            texts = [join_lines(lines) for lines in self.engines.run("read", images, self.spec.timeout_s)]
        if len(texts) != len(images):
            raise RuntimeError(f"engine returned {len(texts)} results for {len(images)} images")
        return texts
