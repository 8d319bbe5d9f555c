"""Checkpoints that resume a run exactly: adapters, EMA, optimizer, scheduler, RNG and sampler states.

Layout of ``<log_dir>/checkpoints/global_step_N/``::

    manifest.json                 written last; a directory without it is not a checkpoint
    config.yaml                   the resolved recipe
    runner.pt                     global step, prompt-sampler states, driver RNG
    actor/rank_0.pt               the actor's state, the same for every strategy and rank count: both adapters
                                  (full tensors), optimizer state keyed by parameter name, LR scheduler, RNG
    adapter/                      the trained adapter in diffusers' LoRA format (pipe.load_lora_weights)
    adapter_ema/                  the EMA adapter, same format

Everything is written to ``global_step_N.tmp`` (by the driver alone: workers return tensors and state) and renamed
when complete, so a crash mid-write leaves the previous checkpoint as the newest valid one. Re-saving a step (the
last one after resuming from it) sets the old ``global_step_N`` aside as ``global_step_N.old`` before renaming the
new one in, and deletes it after; a crash in between leaves the ``.old`` copy, which counts as step N until a
save replaces it. A run saved with n actor ranks resumes with any number of ranks.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml
from omegaconf import OmegaConf

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
# 2: one rank-independent actor state, optimizer state keyed by parameter name (1: per-rank, keyed by index)
FORMAT_VERSION = 2
STEP_DIR = re.compile(r"^global_step_(\d+)$")
ASIDE = ".old"  # suffix of a checkpoint set aside while a re-save of its step is renamed in
_CHECKPOINT_DIR = re.compile(rf"^global_step_(\d+)(?:{re.escape(ASIDE)})?$")
# adapter name -> its folder in a checkpoint, diffusers' LoRA format (written by the driver from the actor's state)
ADAPTER_DIRS = {"default": "adapter", "ema": "adapter_ema"}


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names what is missing or mismatched."""


def step_dir(root: Path, step: int) -> Path:
    return root / f"global_step_{step}"


def save_checkpoint(root: Path, step: int, *, runner_state: dict[str, Any], actor_states: list[dict[str, Any]],
                    config_yaml: str, model_info: dict[str, Any], write_adapters: Callable[[Path], None],
                    keep_last_n: int = 0) -> Path:
    """Write checkpoint ``step`` atomically, then prune to the newest ``keep_last_n`` (0 keeps all).

    ``actor_states``: ``[state]``, the actor's rank-independent state (its ``world_size`` goes to the manifest).
    """
    final = step_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "actor").mkdir(parents=True)
    (tmp / "config.yaml").write_text(config_yaml)
    torch.save(runner_state, tmp / "runner.pt")
    for rank, state in enumerate(actor_states):
        torch.save(state, tmp / "actor" / f"rank_{rank}.pt")
    write_adapters(tmp)
    manifest = {"format_version": FORMAT_VERSION, "global_step": step, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                "actor_world_size": actor_states[0].get("world_size", 1), **model_info}
    _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=2))
    aside = final.with_name(final.name + ASIDE)
    if final.exists():  # a re-save of the same step (e.g. after resuming from it): keep the old until the new is in
        shutil.rmtree(aside, ignore_errors=True)
        final.rename(aside)
    tmp.rename(final)
    _sync_dir(root)
    shutil.rmtree(aside, ignore_errors=True)
    if keep_last_n > 0:
        for old in complete_checkpoints(root)[:-keep_last_n]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _write_synced(path: Path, text: str) -> None:
    """Write ``path`` and flush it to disk: the manifest marks a checkpoint complete, so it must outlive a crash."""
    with open(path, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())


def _sync_dir(path: Path) -> None:
    """Flush ``path``'s entries (the renames in it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_adapters(directory: Path, adapters: dict[str, dict[str, torch.Tensor]], model_cfg: Any) -> None:
    """Both adapters' tensors (the actor's ``state_dict()["adapters"]``) in diffusers' LoRA format, as the model's
    ``save_lora`` writes them, without a model: the driver writes them (``model_cfg``: the recipe's actor.model)."""
    from rlrunner.models import model_class  # the model families' modules load only when a checkpoint is written

    family = model_class(model_cfg.model_type)
    for name, folder in ADAPTER_DIRS.items():
        family.write_lora_files(str(directory / folder), adapters[name], model_cfg[model_cfg.model_type])


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root`` (one run's ``checkpoints/``), oldest first, one per step: its
    ``global_step_N``, or the ``global_step_N.old`` that a crash during a re-save of step N left instead."""
    if not root.is_dir():
        return []
    found: dict[int, Path] = {}
    for path in sorted(root.iterdir(), key=lambda p: p.name.endswith(ASIDE)):  # global_step_N before its .old
        if (m := _CHECKPOINT_DIR.match(path.name)) and (path / MANIFEST).is_file():
            found.setdefault(int(m.group(1)), path)
    return [found[step] for step in sorted(found)]


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


def latest_checkpoint(log_root: Path, experiment: str) -> Path | None:
    """The newest complete checkpoint of experiment ``experiment`` in any run folder under ``log_root``; None if
    there is none."""
    candidates = [c for run in log_root.glob("*/checkpoints") for c in complete_checkpoints(run)
                  if experiment_of(c) == experiment]
    if not candidates:
        return None
    return max(candidates, key=lambda p: (json.loads((p / MANIFEST).read_text())["created"], p.stat().st_mtime))


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


def resolve_resume_dir(resume_dir: str, log_root: Path, experiment: str) -> Path:
    """``global_step_N`` dir as given; a run's log dir → its newest checkpoint; ``auto`` → :func:`latest_checkpoint`
    (an error when there is none: the runner checks for that case itself and starts from scratch)."""
    if resume_dir == "auto":
        latest = latest_checkpoint(log_root, experiment)
        if latest is None:
            raise CheckpointError(f"runner.resume_dir=auto: no complete checkpoint of experiment {experiment!r} "
                                  f"under {log_root}/*/checkpoints")
        return latest
    path = Path(resume_dir).expanduser()
    aside = path.with_name(path.name + ASIDE)
    if not path.exists() and STEP_DIR.match(path.name) and (aside / MANIFEST).is_file():
        logger.warning("%s is missing: a re-save of its step was interrupted; resuming from the copy set aside, %s",
                       path, aside)
        return aside
    if not path.exists():
        raise CheckpointError(f"runner.resume_dir={resume_dir!r} does not exist")
    if _CHECKPOINT_DIR.match(path.name) or path.name.endswith(".tmp"):
        return path
    ckpts = complete_checkpoints(path / "checkpoints") or complete_checkpoints(path)
    if not ckpts:
        raise CheckpointError(f"runner.resume_dir={resume_dir!r} holds no complete checkpoint (global_step_N with "
                              f"{MANIFEST})")
    return ckpts[-1]


def _same_setting(key: str, saved: Any, expected: Any) -> bool:
    """Whether a manifest's ``key`` matches the resuming recipe's; a relative ``model_path`` (checkpoints written
    before recipe paths were made absolute) is taken from the working directory, as its run took it."""
    if key == "model_path" and isinstance(saved, str) and saved and not os.path.isabs(saved):
        return saved == expected or os.path.normpath(os.path.join(os.getcwd(), saved)) == expected
    return saved == expected


def resume_point(resume_dir: str, log_root: Path, recipe: dict[str, Any]) -> Path | None:
    """The checkpoint a run with the resolved ``recipe`` resumes from; None for ``auto`` without one yet.

    ``auto`` takes the newest checkpoint of the recipe's experiment under ``log_root`` (the folder holding the run
    folders) and refuses one made with a different recipe (:func:`check_resume_recipe`).
    """
    if resume_dir != "auto":
        return resolve_resume_dir(resume_dir, log_root, "")
    experiment = recipe["runner"]["logger"]["experiment_name"]
    latest = latest_checkpoint(log_root, experiment)
    if latest is None:
        # the same command line is re-issued after every preemption, also one that struck before the first save
        logger.warning("runner.resume_dir=auto: no complete checkpoint of experiment %r under %s/*/checkpoints yet; "
                       "starting from scratch", experiment, log_root)
        return None
    check_resume_recipe(latest, recipe)
    return latest


def load_checkpoint(path: Path, model_info: dict[str, Any], actor_world_size: int) -> dict[str, Any]:
    """Read and check a checkpoint; returns ``{"manifest", "runner", "actor": [state]}`` (one rank-independent
    actor state, for all ``actor_world_size`` ranks of the resuming run)."""
    if not (path / MANIFEST).is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint: {MANIFEST} is missing (interrupted save?); "
                              f"use an earlier global_step_N or runner.resume_dir=auto")
    manifest = json.loads((path / MANIFEST).read_text())
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format_version {manifest.get('format_version')}, this rlrunner "
                              f"reads {FORMAT_VERSION}; resume it with the rlrunner version that wrote it")
    for key, expected in model_info.items():
        if not _same_setting(key, manifest.get(key), expected):
            raise CheckpointError(f"checkpoint {path} was made with {key}={manifest.get(key)!r}, this recipe has "
                                  f"{key}={expected!r}; resume with the same model and LoRA settings")
    missing = [name for name in ("runner.pt", "actor/rank_0.pt") if not (path / name).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {path} is missing {missing}")
    if manifest["actor_world_size"] != actor_world_size:
        logger.info("checkpoint %s was saved by %d actor rank(s); resuming on %d", path, manifest["actor_world_size"],
                    actor_world_size)
    state = torch.load(path / "actor" / "rank_0.pt", weights_only=False)
    if "ema" not in state["adapters"]:
        logger.warning("checkpoint %s has no EMA adapter: EMA restarts from the trained adapter, so this resume is "
                       "NOT exact", path)
        state["adapters"]["ema"] = dict(state["adapters"]["default"])
    return {"manifest": manifest, "runner": torch.load(path / "runner.pt", weights_only=False), "actor": [state]}
