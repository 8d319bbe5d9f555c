"""Which checkpoint a run resumes from, and whether its recipe allows it: ``runner.resume_dir`` (a checkpoint
folder, a run folder or ``auto``) names one by the rules of :mod:`rlrunner.run.checkpoint_index`, and for every form
the recipe saved with it is compared with the resuming one, refused (one line naming each key, the saved value and
the new one) when they differ in anything but run length, logging, checkpointing, resume and placement keys."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rlrunner.run.checkpoint import CheckpointError
from rlrunner.run.checkpoint_index import experiment_of, find_checkpoint, saved_recipe

logger = logging.getLogger(__name__)

# keys a resumed run may change freely: its length, logging, evaluation, checkpointing, resume and placement, the
# actor's engine included (the results do not depend on the number or place of the actor ranks, nor on DDP or
# FSDP2: tests/workers/test_data_parallel.py). The rollout's ranks do matter: their groups seed the rollout noise, which
# Runner.check_resumable compares.
RESUME_FREE_KEYS = ("runner.max_steps", "runner.max_epochs", "runner.logger.", "runner.resume_dir",
                    "runner.resume_allow_changes", "runner.log_dir", "runner.save_interval", "runner.keep_last_n",
                    "runner.val_check_interval", "runner.val_before_train", "runner.sample_log_interval",
                    "runner.num_logged_samples", "runner.max_restarts", "runner.save_on_signal", "runner.watch.", "cluster.",
                    "actor.strategy", "actor.one_rank_group")


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    return {k: v for key, value in node.items() for k, v in _flat(value, f"{prefix}{key}.").items()}


def recipe_changes(ckpt: Path, recipe: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (checkpoint's value, recipe's value)}`` for the keys where the resolved ``recipe`` differs
    from the one saved with ``ckpt``, but for :data:`RESUME_FREE_KEYS`."""
    saved, now = _flat(saved_recipe(ckpt)), _flat(recipe)
    return {key: (saved.get(key), now.get(key)) for key in sorted(saved.keys() | now.keys())
            if saved.get(key) != now.get(key) and not key.startswith(RESUME_FREE_KEYS)}


def check_resume_recipe(ckpt: Path, recipe: dict[str, Any], resume_dir: str) -> None:
    """Refuse (one line naming the keys) to resume ``ckpt``, found through ``resume_dir``, into a recipe that
    differs from its own, but for the keys its ``runner.resume_allow_changes`` lists (``true``: any)."""
    allow = recipe["runner"]["resume_allow_changes"]
    if allow is True:
        return
    changes = recipe_changes(ckpt, recipe)
    changed = [key for key in changes if key not in (allow or [])]
    if not changed:
        return
    shown = ", ".join(f"{key} ({changes[key][0]!r} -> {changes[key][1]!r})" for key in changed)
    if resume_dir == "auto":
        which = f"runner.resume_dir=auto: the newest checkpoint of experiment {experiment_of(ckpt)!r}, {ckpt},"
        other = ", or start a separate experiment with its own runner.logger.experiment_name"
    else:
        which, other = f"runner.resume_dir={resume_dir!r}: checkpoint {ckpt}", ""
    raise CheckpointError(f"{which} was made with a different recipe: {shown}; resume it anyway with "
                          f"runner.resume_allow_changes=[{','.join(changed)}] (or true){other}")


def resume_point(resume_dir: str, log_root: Path, recipe: dict[str, Any]) -> Path | None:
    """The checkpoint a run with the resolved ``recipe`` resumes from (:func:`find_checkpoint`; ``log_root``: the
    folder holding the run folders, where ``auto`` looks), its recipe checked (:func:`check_resume_recipe`); None
    for ``auto`` without one yet.

    Raises:
        CheckpointError: no such checkpoint, none that reads back, or one made with another recipe.
    """
    experiment = recipe["runner"]["logger"]["experiment_name"]
    found = find_checkpoint(resume_dir, log_root, experiment)
    if found is None:
        # the same command line is re-issued after every preemption, also one that struck before the first save
        logger.warning("runner.resume_dir=auto: no complete checkpoint of experiment %r under %s/*/checkpoints yet; "
                       "starting from scratch", experiment, log_root)
        return None
    check_resume_recipe(found, recipe, resume_dir)
    return found
