"""What every reward returns: :class:`RewardOutput` (scores, per-part scores, error counts, logging material)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


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

    def recognised_texts(self) -> list[str] | None:
        """What the reward read in each sample (video: in its first frame), for the sample grids; ``None`` when the
        reward reads no text. A ``multi`` reward keeps its OCR part's as ``<part>/texts``."""
        key = next((k for k in self.extra if k == "texts" or k.endswith("/texts")), None)
        if key is None:
            return None
        return [str((t or [""])[0]) if isinstance(t, list) else str(t) for t in self.extra[key]]

    def metrics(self) -> dict[str, float]:
        """Scalars to log: each part's mean, and for a reward that reports ``accuracy`` and ``tags`` per sample
        (GenEval) the share of right samples (``<reward>/accuracy``), each tag's (``<reward>/<tag>``) and their mean
        over tags (``<reward>/overall``, GenEval's "Overall score" of ``evaluation/summary_scores.py``)."""
        metrics = {name: float(values.mean()) for name, values in self.parts.items()}
        for key in [k for k in self.extra if k == "tags" or k.endswith("/tags")]:
            prefix = key[: -len("tags")]
            if f"{prefix}accuracy" not in self.extra:
                continue
            label = prefix.rstrip("/") or next(iter(self.parts), "reward")
            tags = [str(t) for t in np.asarray(self.extra[key]).reshape(-1)]
            accuracy = np.asarray(self.extra[f"{prefix}accuracy"], dtype=np.float64).reshape(-1)
            metrics[f"{label}/accuracy"] = float(accuracy.mean())
            per_tag = {tag: float(accuracy[[t == tag for t in tags]].mean()) for tag in sorted({t for t in tags if t})}
            metrics.update({f"{label}/{tag}": value for tag, value in per_tag.items()})
            if per_tag:
                metrics[f"{label}/overall"] = float(np.mean(list(per_tag.values())))
        return metrics

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
                extra[key] = sum_counts(values)
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


def sum_counts(counts: list[Mapping[str, int]]) -> dict[str, int]:
    """Add up reason -> count mappings (``RewardOutput.extra['error_reasons']`` of several outputs)."""
    total: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    return total
