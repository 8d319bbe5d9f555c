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
