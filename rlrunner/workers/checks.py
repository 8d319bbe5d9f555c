"""The checks of the actor worker's keys: its batch sizes, seed and optimizer (``actor.optim.*``). How the batches
share the placed devices is checked with the placement (:func:`rlrunner.step.checks.check_placement`).
Registered in :mod:`rlrunner.recipe`."""

from __future__ import annotations

from rlrunner.config.check_kinds import POSITIVE_INT, SEED, UNIT_OPEN, Check, Choice, Range, fixed

KEY_CHECKS: dict[str, Check] = {
    "actor.micro_batch_size": POSITIVE_INT,  # and its shares of the actor devices (cluster.checks)
    "actor.global_batch_size": POSITIVE_INT,
    "actor.seed": SEED,
    "actor.optim.optimizer": Choice(fixed("adamw")),  # workers/actor.py builds AdamW
    "actor.optim.lr": Range(low=0, low_open=True),
    "actor.optim.weight_decay": Range(low=0),
    "actor.optim.adam_beta1": UNIT_OPEN,
    "actor.optim.adam_beta2": UNIT_OPEN,
    "actor.optim.adam_eps": Range(low=0, low_open=True),
    "actor.optim.clip_grad": Range(low=0, low_open=True, meaning="max gradient norm"),
    "actor.optim.lr_scheduler": Choice(fixed("constant", "cosine", "linear")),  # diffusers get_scheduler names
    "actor.optim.lr_warmup_steps": Range(low=0),
}
