"""Which checkpoint a run resumes from: ``runner.resume_dir`` as a checkpoint or run folder, or ``auto``: the newest
checkpoint of the recipe's experiment across run folders that reads back, refused (one line naming the keys) when
it was made with a different recipe. The checkpoint files themselves: :mod:`rlrunner.run.checkpoint`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from rlrunner.run.checkpoint import (
    ASIDE,
    CHECKPOINT_DIR,
    MANIFEST,
    STEP_DIR,
    WRITING,
    CheckpointError,
    complete_checkpoints,
    first_loadable,
    log_skipped,
    save_order,
)

logger = logging.getLogger(__name__)

# keys a resumed run may change freely: its length, logging, evaluation, checkpointing, resume and placement (the
# results do not depend on the number or place of the ranks: tests/test_data_parallel.py)
RESUME_FREE_KEYS = ("runner.max_steps", "runner.max_epochs", "runner.logger.", "runner.resume_dir",
                    "runner.resume_allow_changes", "runner.log_dir", "runner.save_interval", "runner.keep_last_n",
                    "runner.val_check_interval", "runner.val_before_train", "runner.sample_log_interval",
                    "runner.num_logged_samples", "runner.max_restarts", "runner.save_on_signal", "cluster.")


def _recipe(ckpt: Path) -> dict[str, Any]:
    try:  # read as it was written (OmegaConf.to_yaml), so values compare equal to the resolved recipe's
        return OmegaConf.to_container(OmegaConf.load(ckpt / "config.yaml")) or {}
    except (OSError, yaml.YAMLError):
        return {}


def experiment_of(ckpt: Path) -> str:
    """The experiment a checkpoint belongs to: its recipe's ``runner.logger.experiment_name``, else (checkpoints
    written before runs recorded it) the recipe name in its run folder ``<YYYYmmdd-HHMMSS>-<recipe>``."""
    name = _recipe(ckpt).get("runner", {}).get("logger", {}).get("experiment_name")
    return name or ckpt.parents[1].name.split("-", 2)[-1]


def _experiment_checkpoints(log_root: Path, experiment: str) -> list[Path]:
    """Complete checkpoints of experiment ``experiment`` in every run folder under ``log_root``, oldest first."""
    return sorted((c for run in log_root.glob("*/checkpoints") for c in complete_checkpoints(run)
                   if experiment_of(c) == experiment), key=save_order)


def latest_checkpoint(log_root: Path, experiment: str) -> Path | None:
    """The newest (last written) complete checkpoint of experiment ``experiment`` in any run folder under
    ``log_root``; None if there is none. Not read back: :func:`resume_point` falls back from one that fails."""
    candidates = _experiment_checkpoints(log_root, experiment)
    return candidates[-1] if candidates else None


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    return {k: v for key, value in node.items() for k, v in _flat(value, f"{prefix}{key}.").items()}


def recipe_changes(ckpt: Path, recipe: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (checkpoint's value, recipe's value)}`` for the keys where the resolved ``recipe`` differs
    from the one saved with ``ckpt``, but for :data:`RESUME_FREE_KEYS`."""
    saved, now = _flat(_recipe(ckpt)), _flat(recipe)
    return {key: (saved.get(key), now.get(key)) for key in sorted(saved.keys() | now.keys())
            if saved.get(key) != now.get(key) and not key.startswith(RESUME_FREE_KEYS)}


def check_resume_recipe(ckpt: Path, recipe: dict[str, Any]) -> None:
    """Refuse (one line naming the keys) to resume ``ckpt`` into a recipe that differs from its own, but for the
    keys its ``runner.resume_allow_changes`` lists (``true``: any)."""
    allow = recipe["runner"]["resume_allow_changes"]
    if allow is True:
        return
    changes = recipe_changes(ckpt, recipe)
    changed = [key for key in changes if key not in (allow or [])]
    if changed:
        shown = ", ".join(f"{key} ({changes[key][0]!r} -> {changes[key][1]!r})" for key in changed)
        raise CheckpointError(f"runner.resume_dir=auto: the newest checkpoint of experiment {experiment_of(ckpt)!r}, "
                              f"{ckpt}, was made with a different recipe: {shown}; resume it anyway with "
                              f"runner.resume_allow_changes=[{','.join(changed)}] (or true), or start a separate "
                              f"experiment with its own runner.logger.experiment_name")


def _newest_that_loads(candidates: list[Path], where: str) -> Path:
    """The newest of ``candidates`` (oldest first) that reads back, logging each newer one skipped and why."""
    found, skipped = first_loadable(reversed(candidates))
    log_skipped(skipped)
    if found is None:
        reasons = "; ".join(f"{s.path.name}: {s.reason}" for s in skipped)
        raise CheckpointError(f"{where}: none of its {len(skipped)} checkpoint(s) loads ({reasons})")
    return found


def resolve_resume_dir(resume_dir: str, log_root: Path, experiment: str) -> Path:
    """``global_step_N`` dir as given; a run's log dir → its newest checkpoint that loads; ``auto`` → the newest
    checkpoint of ``experiment`` under ``log_root`` that loads (an error when there is none: the runner checks for
    that case itself and starts from scratch)."""
    if resume_dir == "auto":
        candidates = _experiment_checkpoints(log_root, experiment)
        if not candidates:
            raise CheckpointError(f"runner.resume_dir=auto: no complete checkpoint of experiment {experiment!r} "
                                  f"under {log_root}/*/checkpoints")
        return _newest_that_loads(candidates, f"runner.resume_dir=auto (experiment {experiment!r})")
    path = Path(resume_dir).expanduser()
    aside = path.with_name(path.name + ASIDE)
    if not path.exists() and STEP_DIR.match(path.name) and (aside / MANIFEST).is_file():
        logger.warning("%s is missing: a re-save of its step was interrupted; resuming from the copy set aside, %s",
                       path, aside)
        return aside
    if not path.exists():
        raise CheckpointError(f"runner.resume_dir={resume_dir!r} does not exist")
    if CHECKPOINT_DIR.match(path.name) or path.name.endswith(WRITING):
        return path
    ckpts = complete_checkpoints(path / "checkpoints") or complete_checkpoints(path)
    if not ckpts:
        raise CheckpointError(f"runner.resume_dir={resume_dir!r} holds no complete checkpoint (global_step_N with "
                              f"{MANIFEST})")
    return _newest_that_loads(ckpts, f"runner.resume_dir={resume_dir!r}")


def resume_point(resume_dir: str, log_root: Path, recipe: dict[str, Any]) -> Path | None:
    """The checkpoint a run with the resolved ``recipe`` resumes from; None for ``auto`` without one yet.

    ``auto`` takes the newest checkpoint of the recipe's experiment under ``log_root`` (the folder holding the run
    folders) that reads back, logging the newer ones it skipped and why, and refuses one made with a different
    recipe (:func:`check_resume_recipe`).
    """
    if resume_dir != "auto":
        return resolve_resume_dir(resume_dir, log_root, "")
    experiment = recipe["runner"]["logger"]["experiment_name"]
    if latest_checkpoint(log_root, experiment) is None:
        # the same command line is re-issued after every preemption, also one that struck before the first save
        logger.warning("runner.resume_dir=auto: no complete checkpoint of experiment %r under %s/*/checkpoints yet; "
                       "starting from scratch", experiment, log_root)
        return None
    found = resolve_resume_dir("auto", log_root, experiment)
    check_resume_recipe(found, recipe)
    return found
