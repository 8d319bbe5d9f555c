"""``reward.type: multi``: a weighted mean of several registered rewards, each part logged on its own.

    reward:
      type: multi
      engine: rapidocr            # inherited by every part that does not set it
      rewards:
        - {model: ocr, weight: 1.0}
        - {model: image_stats, weight: 0.2}

``avg = Σ weight_i · avg_i / Σ weight_i``; a part with ``[B]`` scores is broadcast over the chunks of a video
part (``[B, K]``). ``aggregation`` decides what the advantages see:

* ``weighted_sum`` (NVlabs' DiffusionNFT, flow_grpo): ``avg``, then group advantages as for one reward (the
  division by ``Σ weight_i`` keeps ``env/avg`` on the parts' scale and leaves group-normalised advantages as they are);
* ``per_reward_normalized`` (GDPO, Flow-Factory's default): ``extra["part_scores"]`` ``[B, P]`` (video
  ``[B, P, K]``) and ``extra["part_weights"]`` ``[B, P]`` go to
  :func:`rlrunner.algorithms.advantages.per_reward_normalized_advantages` instead: each part z-scored within its
  group, weighted, summed, then normalised over the batch.

A part with ``required: false`` that raises or cannot score any sample is dropped for that batch (weight 0, not
in ``parts``) and counted: ``parts["<name>_dropped"]`` is 1 for its samples then, 0 otherwise (``env/<name>_dropped``
is the fraction of a step's samples that lacked it), and its error is logged once. ``parts`` holds each part's per-sample scores under its name (``ocr``, ``image_stats``;
a repeated model gets ``_2``, ``_3``...); each part's ``extra`` entries are kept as ``"<name>/<key>"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlrunner.config.schema import RewardConfig

from .inputs import reason_key
from .output import RewardOutput, sum_counts
from .registry import Reward, build_single, part_config, register_reward_type, score

AGGREGATIONS = ("weighted_sum", "per_reward_normalized")


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
        self.required: list[bool] = []
        if spec.aggregation not in AGGREGATIONS:
            raise ValueError(f"Unknown reward.aggregation {spec.aggregation!r}; valid: {list(AGGREGATIONS)}")
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
            self.required.append(bool(part_cfg.required))
        if sum(self.weights) <= 0:
            raise ValueError(f"reward.rewards weights must sum to > 0, got {self.weights}")
        self.uses_metadata = any(child.uses_metadata for child in self.children)

    def __call__(self, images: np.ndarray, prompts: list[str],
                 metadata: list[dict[str, Any]] | None = None) -> RewardOutput:
        outs = [self._score_part(i, images, prompts, metadata) for i in range(len(self.children))]
        kept = [i for i, o in enumerate(outs) if o is not None]
        if not kept:
            return RewardOutput(avg=np.zeros(len(prompts), np.float32), errors=len(prompts),
                                failure="every part of the multi reward was dropped (see the warnings above)")
        ndim = max(outs[i].avg.ndim for i in kept)
        shape = next(outs[i].avg.shape for i in kept if outs[i].avg.ndim == ndim)
        scores = np.zeros((len(outs), *shape), dtype=np.float32)  # [P, B(, K)], 0 for a dropped part
        for i in kept:
            avg = outs[i].avg
            scores[i] = np.broadcast_to(avg.reshape(avg.shape + (1,) * (ndim - avg.ndim)), shape)
        weights = np.array([self.weights[i] if outs[i] is not None else 0.0 for i in range(len(outs))], np.float32)
        if weights.sum() <= 0:
            weights = np.array([1.0 if o is not None else 0.0 for o in outs], np.float32)  # weight 0 parts remain
        total = np.tensordot(weights.astype(np.float64), scores, axes=1) / weights.sum()
        parts, extra = self._parts_and_extra(outs, len(prompts))
        if self.spec.aggregation == "per_reward_normalized":
            extra["part_scores"] = np.moveaxis(scores, 0, 1).copy()
            extra["part_weights"] = np.broadcast_to(weights, (len(prompts), len(outs))).copy()
        kept_outs = [outs[i] for i in kept]
        masks = [o.extra.get("error_mask") for o in kept_outs]
        if all(m is not None and m.shape == masks[0].shape for m in masks):
            mask = np.logical_or.reduce(masks)
            extra["error_mask"] = mask
            errors = int(mask.sum())
        else:
            errors = sum(o.errors for o in kept_outs)
        # one required part that cannot score makes the weighted mean meaningless
        failure = "; ".join(f"{self.names[i]}: {outs[i].failure}" for i in kept if outs[i].failure)
        return RewardOutput(avg=total.astype(np.float32), parts=parts, errors=errors, extra=extra, failure=failure)

    def _score_part(self, i: int, images: np.ndarray, prompts: list[str],
                    metadata: list[dict[str, Any]] | None) -> RewardOutput | None:
        """Part ``i``'s output; ``None`` when an optional part raised or could score no sample (dropped)."""
        if self.required[i]:
            return score(self.children[i], images, prompts, metadata)
        try:
            out = score(self.children[i], images, prompts, metadata)
        except Exception as err:  # noqa: BLE001  an optional part may fail in any way; the others carry the step
            self.warn_once(f"{self.names[i]} dropped", f"optional part {self.names[i]} raised {err!r}; it is "
                           "dropped for this batch (env/<name>_dropped)")
            return None
        mask = out.extra.get("error_mask")
        if out.failure or (mask is not None and mask.size and mask.all()):
            reason = out.failure or "no sample could be scored"
            self.warn_once(f"{self.names[i]} dropped", f"optional part {self.names[i]}: {reason_key(reason)}; it is "
                           "dropped for such batches (env/<name>_dropped)")
            return None
        return out

    def _parts_and_extra(self, outs: list[RewardOutput | None], batch: int) -> tuple[dict, dict]:
        parts: dict[str, np.ndarray] = {}
        extra: dict = {}
        for name, child, required, out in zip(self.names, self.children, self.required, outs):
            if not required:
                parts[f"{name}_dropped"] = np.full(batch, float(out is None), dtype=np.float32)
            if out is None:
                continue
            for part_name, scores in out.parts.items():
                parts[name if part_name == child.name else f"{name}/{part_name}"] = scores
            extra.update({f"{name}/{k}": v for k, v in out.extra.items()})
        extra["error_reasons"] = sum_counts(
            [{f"{n}/{k}": v for k, v in o.extra.get("error_reasons", {}).items()}
             for n, o in zip(self.names, outs) if o is not None])
        return parts, extra
