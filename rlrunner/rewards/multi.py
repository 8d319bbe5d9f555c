"""``reward.type: multi``: a weighted mean of several registered rewards, each part logged on its own.

    reward:
      type: multi
      engine: rapidocr            # inherited by every part that does not set it
      rewards:
        - {model: ocr, weight: 1.0}
        - {model: image_stats, weight: 0.2}

``avg = Σ weight_i · avg_i / Σ weight_i``; a part with ``[B]`` scores is broadcast over the chunks of a video
part (``[B, K]``). ``parts`` holds each part's per-sample scores under its name (``ocr``, ``image_stats``;
a repeated model gets ``_2``, ``_3``...); each part's ``extra`` entries are kept as ``"<name>/<key>"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlrunner.config.schema import RewardConfig

from .output import RewardOutput, sum_counts
from .registry import Reward, build_single, part_config, register_reward_type, score


@register_reward_type("multi")
class MultiReward(Reward):
    """Weighted mean of the rewards listed in ``spec.rewards`` (each a dict of reward keys)."""

    name = "multi"

    def __init__(self, spec: RewardConfig) -> None:
        super().__init__(spec)
        if not spec.rewards:
            raise ValueError(
                "reward.type=multi needs a non-empty reward.rewards list, e.g. [{model: ocr, weight: 1.0}]"
            )
        self.names: list[str] = []
        self.children: list[Reward] = []
        self.weights: list[float] = []
        for part in spec.rewards:
            if part.get("type", "single") != "single" or part.get("rewards"):
                raise ValueError(f"reward.rewards entries cannot be multi rewards themselves, got {dict(part)}")
            part_cfg = part_config(spec, part)
            child = build_single(part_cfg)
            name, n = child.name or part_cfg.model, 2
            while name in self.names:
                name, n = f"{child.name or part_cfg.model}_{n}", n + 1
            self.names.append(name)
            self.children.append(child)
            self.weights.append(float(part_cfg.weight))
        if sum(self.weights) <= 0:
            raise ValueError(f"reward.rewards weights must sum to > 0, got {self.weights}")
        self.uses_metadata = any(child.uses_metadata for child in self.children)

    def __call__(self, images: np.ndarray, prompts: list[str],
                 metadata: list[dict[str, Any]] | None = None) -> RewardOutput:
        outs = [score(child, images, prompts, metadata) for child in self.children]
        ndim = max(o.avg.ndim for o in outs)
        shape = next(o.avg.shape for o in outs if o.avg.ndim == ndim)
        total = np.zeros(shape, dtype=np.float64)
        for weight, out in zip(self.weights, outs):
            avg = out.avg if out.avg.ndim == ndim else out.avg.reshape(out.avg.shape + (1,) * (ndim - out.avg.ndim))
            total += weight * np.broadcast_to(avg, shape)
        parts: dict[str, np.ndarray] = {}
        extra: dict = {}
        for name, child, out in zip(self.names, self.children, outs):
            for part_name, scores in out.parts.items():
                parts[name if part_name == child.name else f"{name}/{part_name}"] = scores
            extra.update({f"{name}/{k}": v for k, v in out.extra.items()})
        masks = [o.extra.get("error_mask") for o in outs]
        if all(m is not None and m.shape == masks[0].shape for m in masks):
            mask = np.logical_or.reduce(masks)
            extra["error_mask"] = mask
            errors = int(mask.sum())
        else:
            errors = sum(o.errors for o in outs)
        extra["error_reasons"] = sum_counts(
            [{f"{n}/{k}": v for k, v in o.extra.get("error_reasons", {}).items()} for n, o in zip(self.names, outs)]
        )
        # one part that cannot score makes the weighted mean meaningless
        failure = "; ".join(f"{name}: {o.failure}" for name, o in zip(self.names, outs) if o.failure)
        return RewardOutput(
            avg=(total / sum(self.weights)).astype(np.float32), parts=parts, errors=errors, extra=extra,
            failure=failure,
        )
