"""The checks of the keys of the torch engines (the actor's data-parallel engine, context-parallel sizes and mode),
registered in :mod:`rlrunner.recipe`. Whether the sizes divide the placed devices is checked with the placement,
by :func:`rlrunner.step.checks.check_placement`; whether they divide the model's heads and tokens, by
:mod:`rlrunner.models.checks`."""

from __future__ import annotations

from rlrunner.config.check_kinds import POSITIVE_INT, Check, Choice, Free, names
from rlrunner.distributed.context_parallel import CP_MODES
from rlrunner.distributed.parallelize import ENGINES

KEY_CHECKS: dict[str, Check] = {
    "actor.strategy": Choice(names(ENGINES)),
    "actor.one_rank_group": Free("bool"),
    "actor.context_parallel_size": POSITIVE_INT,  # and the model's heads and tokens (models.checks)
    "actor.context_parallel_mode": Choice(names(CP_MODES)),
    "rollout.context_parallel_size": POSITIVE_INT,
}
