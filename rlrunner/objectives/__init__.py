"""Algorithms as the workers see them (``algorithm.name``): how the training rollout integrates and what it keeps
per sample (:meth:`Objective.rollout`), and the actor's loss on a micro-batch of it (:meth:`Objective.loss`).

Each algorithm is one file here, a thin layer over its pure math in ``rlrunner/algorithms/``; rollout, rewards,
advantages, EMA, weight sync, checkpoints and logging are shared. To add one: subclass :class:`Objective` in
``objectives/<name>.py`` and list it in ``OBJECTIVES``. The checks of the ``algorithm.*`` keys are in
``checks.py``.

May import: rlrunner.algorithms, rlrunner.config, rlrunner.distributed, rlrunner.models, rlrunner.utils
"""

from __future__ import annotations

from typing import Any

from rlrunner.models.guidance import Guidance
from rlrunner.objectives.base import MicroBatch, Objective
from rlrunner.utils.registry import lazy_class

OBJECTIVES: dict[str, str] = {
    "nft": "rlrunner.objectives.nft:NFTObjective",
    "flow_grpo": "rlrunner.objectives.flow_grpo:FlowGRPOObjective",
    "awm": "rlrunner.objectives.awm:AWMObjective",
}


def objective_class(name: str) -> type[Objective]:
    """The :class:`Objective` subclass registered as ``algorithm.name`` ``name``."""
    return lazy_class(OBJECTIVES, name, "algorithm.name")


def build_objective(algorithm_cfg: Any, family_cfg: Any, guidance: Guidance) -> Objective:
    """The :class:`Objective` of ``algorithm_cfg.name`` for a model that samples with ``guidance`` (the model's
    ``resolved_guidance``, or the plan's :attr:`~rlrunner.sizing.memory.ModelSizes.guidance`)."""
    return objective_class(algorithm_cfg.name)(algorithm_cfg, family_cfg, guidance)


__all__ = ["OBJECTIVES", "MicroBatch", "Objective", "build_objective", "objective_class"]
