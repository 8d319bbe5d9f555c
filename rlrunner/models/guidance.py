"""Guidance, decided once: the recipe's ``guidance`` / scales and the model folder's config files (no weights) become
one immutable :class:`Guidance` that sampling, the losses, the recipe checks and the memory plan all read.

:meth:`rlrunner.models.base.FlowModel.resolve_guidance` computes it, at recipe check (from the folder's
``model_index.json`` and component ``config.json`` files) and once when a model is built (from the loaded pipeline's
configs: the same files); a family's own rule is its ``guidance_kind`` hook (FLUX.1: dev or schnell by the
transformer's ``guidance_embeds``; FLUX.2-klein: ``is_distilled`` in ``model_index.json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: how guidance reaches a denoiser (``actor.model.<family>.guidance``; ``auto``: the family's default):
#: ``cfg`` two passes (negative and conditional) combined by the family's rule; ``embedded`` the scale is a model
#: input, one pass (FLUX.1-dev); ``none`` one pass, no guidance (distilled models)
GUIDANCE_KINDS = ("auto", "cfg", "embedded", "none")
#: the combination of most pipelines (SD3, Wan, FLUX.1's ``true_cfg_scale``, FLUX.2-klein)
PLAIN_COMBINE = "neg + s (cond - neg)"


@dataclass(frozen=True)
class Guidance:
    """The guidance a model samples with, resolved from the recipe and the model folder.

    Attributes:
        kind: ``cfg``, ``embedded`` or ``none`` (never ``auto``).
        scale, eval_scale: the CFG / embedded scale ``s`` of training and evaluation rollouts (1 = off).
        scale_2, eval_scale_2: the low-noise expert's scale in force for a two-expert family (the recipe's
            ``guidance_scale_2``, or ``scale`` when that is null or guidance is off, as WanPipeline); ``None`` for
            one denoiser.
        combine: the family's rule for the two ``cfg`` halves, as its ``combine_guidance`` computes it.
    """

    kind: str
    scale: float
    eval_scale: float
    scale_2: float | None = None
    eval_scale_2: float | None = None
    combine: str = PLAIN_COMBINE

    def passes_at(self, scale: float) -> int:
        """Denoiser passes per sampling step at ``scale``: 2 for ``cfg`` above 1 (negative and conditional), else 1."""
        return 2 if self.kind == "cfg" and scale > 1.0 else 1

    @property
    def passes(self) -> int:
        """Passes per step of a training rollout (the low-noise expert guides only when the high-noise one does)."""
        return self.passes_at(self.scale)

    @property
    def eval_passes(self) -> int:
        return self.passes_at(self.eval_scale)


def recipe_kind(family: Any, family_cfg: Any) -> str | None:
    """The recipe's guidance kind for ``family`` (a FlowModel class), ``None`` for ``auto``; a kind the family lacks
    is a ``ValueError`` naming the kinds it has."""
    kind = str(getattr(family_cfg, "guidance", "auto"))
    if kind == "auto":
        return None
    if kind not in family.guidance_kinds:
        raise ValueError(f"actor.model.{family.model_type}.guidance={kind!r} is not supported by this family; "
                         f"choose one of {['auto', *family.guidance_kinds]}")
    return kind


def resolve(family: Any, family_cfg: Any, kind: str) -> Guidance:
    """``kind`` (from the family's ``guidance_kind`` hook) with the recipe's scales checked against it, as one
    :class:`Guidance`; each refusal is a one-line ``ValueError`` naming the key."""
    key = f"actor.model.{family.model_type}"
    scale, eval_scale = float(family_cfg.guidance_scale), float(family_cfg.eval_guidance_scale)
    if kind == "none" and (scale != 1 or eval_scale != 1):
        raise ValueError(f"{key}.guidance=none samples without guidance, but guidance_scale={family_cfg.guidance_scale}"
                         f" / eval_guidance_scale={family_cfg.eval_guidance_scale}; set both to 1.0 or choose another "
                         f"guidance")
    low = [_low_noise_scale(family, family_cfg, high, f"{name}_2") for high, name in
           ((scale, "guidance_scale"), (eval_scale, "eval_guidance_scale"))]
    return Guidance(kind, scale, eval_scale, *low, combine=family.guidance_combine)


def _low_noise_scale(family: Any, family_cfg: Any, high: float, name: str) -> float | None:
    """The low-noise expert's scale in force (two experts), or ``None``; a second scale on one denoiser, or one that
    cannot apply (WanPipeline guides only when the high-noise scale is > 1), is a ``ValueError``."""
    key, low = f"actor.model.{family.model_type}", getattr(family_cfg, name, None)
    if not family.expert_components:
        if low is not None:
            raise ValueError(f"{key}.{name}={low!r} applies to a model with two experts (wan22_t2v_a14b); "
                             f"{family.model_type} has one denoiser: remove it")
        return None
    high_name = name.removesuffix("_2")
    if low is not None and low != 1 and high <= 1:
        raise ValueError(f"{key}.{name}={low} but {high_name}={family_cfg[high_name]}: the pipeline guides (both "
                         f"experts) only when {high_name} > 1; set {high_name} > 1 or {name} to null")
    return low_noise_in_force(high, low)


def low_noise_in_force(high: float, low: float | None) -> float:
    """WanPipeline's low-noise scale: ``guidance_scale_2`` (``low``) where set and guidance is on (``high > 1``),
    else the high-noise scale."""
    return float(high) if low is None or high <= 1 else float(low)
