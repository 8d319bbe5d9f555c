"""Which checkpoint: the one index that resume (``runner.resume_dir``), in-run restart (:func:`restart_point`) and
export (``bin/rlrunner export``) ask. The files of one checkpoint: :mod:`rlrunner.run.checkpoint`; whether its
recipe allows a resume: :mod:`rlrunner.run.checkpointer`.

Complete means the checkpoint has its manifest (written last: a ``global_step_N.tmp`` or a ``global_step_N`` a crash
cut short before the manifest is never listed); a ``global_step_N.old`` that an interrupted re-save left stands for
step N. Newest means last written (the manifest's UTC time, then the step), not the highest step. Reads back means
:func:`~rlrunner.run.checkpoint.verify_checkpoint` passes (every file has its recorded size and opens).

One rule per ``runner.resume_dir`` form (:func:`find_checkpoint`):

* **a checkpoint folder** (``<run>/checkpoints/global_step_N``, or any folder holding a manifest): that checkpoint
  and no other; one that does not read back (a ``.tmp`` one among them) is an error naming the file. When it is
  missing but the ``global_step_N.old`` copy of an interrupted re-save is complete, that copy, with a warning.
* **a run folder** (``<run>`` or ``<run>/checkpoints``): the run's newest complete checkpoint that reads back; each
  newer one that does not is skipped with a warning saying why; an error listing them when none reads back.
* **auto**: the same rule over every run folder under the log root (where the launcher writes), counting only the
  checkpoints of the recipe's experiment (``runner.logger.experiment_name``); none at all: None (the run starts
  from scratch).

In-run restart takes the run's own folder by the run-folder rule, else where the run started; export takes the
checkpoint-folder and run-folder rules.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from rlrunner.run.checkpoint import (
    ASIDE,
    CHECKPOINT_DIR,
    MANIFEST,
    WRITING,
    CheckpointError,
    complete_checkpoints,
    save_order,
    verify_checkpoint,
)

logger = logging.getLogger(__name__)


def saved_recipe(ckpt: Path) -> dict[str, Any]:
    """The recipe saved with ``ckpt`` as a plain dict (``{}`` when it has none that parses)."""
    try:  # read as it was written (OmegaConf.to_yaml), so values compare equal to the resolved recipe's
        return OmegaConf.to_container(OmegaConf.load(ckpt / "config.yaml")) or {}
    except (OSError, yaml.YAMLError):
        return {}


def experiment_of(ckpt: Path) -> str:
    """The experiment a checkpoint belongs to: its recipe's ``runner.logger.experiment_name``, else (checkpoints
    written before runs recorded it) the recipe name in its run folder ``<YYYYmmdd-HHMMSS>-<recipe>``."""
    name = saved_recipe(ckpt).get("runner", {}).get("logger", {}).get("experiment_name")
    return name or ckpt.parents[1].name.split("-", 2)[-1]


@dataclass(frozen=True)
class Skipped:
    """A checkpoint passed over because it does not read back, and why (a :class:`CheckpointError`'s text)."""

    path: Path
    reason: str


@dataclass(frozen=True)
class CheckpointIndex:
    """The complete checkpoints of one run or one experiment, oldest (first written) first, and what the user
    named to get them (``where``, for messages)."""

    checkpoints: tuple[Path, ...]
    where: str

    @classmethod
    def of_run(cls, folder: Path, where: str = "") -> CheckpointIndex:
        """The checkpoints of the run in ``folder``: a run's log dir, or its ``checkpoints/`` folder."""
        found = complete_checkpoints(folder / "checkpoints") or complete_checkpoints(folder)
        return cls(tuple(found), where or str(folder))

    @classmethod
    def of_experiment(cls, log_root: Path, experiment: str) -> CheckpointIndex:
        """The checkpoints of experiment ``experiment`` in every run folder under ``log_root``."""
        found = [c for run in log_root.glob("*/checkpoints") for c in complete_checkpoints(run)
                 if experiment_of(c) == experiment]
        return cls(tuple(sorted(found, key=save_order)), f"runner.resume_dir=auto (experiment {experiment!r})")

    def newest(self) -> Path | None:
        """The newest complete checkpoint, not read back; None when there is none."""
        return self.checkpoints[-1] if self.checkpoints else None

    def newest_loadable(self) -> tuple[Path | None, list[Skipped]]:
        """The newest checkpoint that reads back (None if none does) and the newer ones skipped, each logged as a
        warning with its reason."""
        skipped = []
        for ckpt in reversed(self.checkpoints):
            try:
                verify_checkpoint(ckpt)
            except CheckpointError as err:
                skipped.append(Skipped(ckpt, str(err)))
                logger.warning("skipping checkpoint %s: %s", ckpt, err)
                continue
            return ckpt, skipped
        return None, skipped

    def pick(self) -> Path:
        """:meth:`newest_loadable`, or an error: no complete checkpoint, or none that reads back (each named)."""
        if not self.checkpoints:
            raise CheckpointError(f"{self.where} holds no complete checkpoint (global_step_N with {MANIFEST})")
        found, skipped = self.newest_loadable()
        if found is None:
            reasons = "; ".join(f"{s.path.name}: {s.reason}" for s in skipped)
            raise CheckpointError(f"{self.where}: none of its {len(skipped)} checkpoint(s) loads ({reasons})")
        return found


def checkpoint_at(given: str, where: str = "") -> Path:
    """The checkpoint that a path names (the checkpoint-folder or run-folder rule of the module docstring).
    ``where``: how messages name it (default ``runner.resume_dir=<given>``).

    Raises:
        CheckpointError: the path does not exist, holds no complete checkpoint, or none that reads back.
    """
    where = where or f"runner.resume_dir={given!r}"
    path = Path(given).expanduser()
    if CHECKPOINT_DIR.match(path.name) or path.name.endswith(WRITING) or (path / MANIFEST).exists():
        return _named_checkpoint(path, where)
    if not path.exists():
        raise CheckpointError(f"{where} does not exist")
    return CheckpointIndex.of_run(path, where).pick()


def _named_checkpoint(path: Path, where: str) -> Path:
    """A checkpoint named by its folder, read back; its ``.old`` copy when a re-save that replaced it was cut
    short."""
    aside = path.with_name(path.name + ASIDE)
    if not path.exists() and (aside / MANIFEST).is_file():
        logger.warning("%s is missing: a re-save of its step was interrupted; resuming from the copy set aside, %s",
                       path, aside)
        path = aside
    if not path.exists():
        raise CheckpointError(f"{where} does not exist")
    verify_checkpoint(path)
    return path


def find_checkpoint(resume_dir: str, log_root: Path, experiment: str) -> Path | None:
    """The checkpoint ``runner.resume_dir`` names (one rule per form: module docstring); None for ``auto`` when
    ``experiment`` has no complete checkpoint under ``log_root`` yet."""
    if resume_dir != "auto":
        return checkpoint_at(resume_dir)
    index = CheckpointIndex.of_experiment(log_root, experiment)
    return index.pick() if index.checkpoints else None


def restart_point(log_dir: Path, resume_dir: str) -> str:
    """Where a restarted run resumes: its own newest checkpoint that reads back (warning about the newer ones it
    skipped and why), else where the run itself started (``resume_dir``)."""
    own, _ = CheckpointIndex.of_run(log_dir / "checkpoints").newest_loadable()
    return str(own) if own is not None else resume_dir
