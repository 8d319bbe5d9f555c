"""Checkpoints that resume a run exactly (adapters, EMA, optimizer, scheduler, RNG and sampler states) and that
cannot lie: a checkpoint counts only when every byte of it reached the disk and it reads back.

Layout of ``<log_dir>/checkpoints/global_step_N/`` (format version 3)::

    manifest.json                 written last: format version, step, UTC save time, every file's size, model info
    config.yaml                   the resolved recipe
    runner.pt                     global step, prompt-sampler states, driver RNG
    actor.pt                      the actor's state, the same for every strategy and rank count: both adapters (full
                                  tensors), optimizer state keyed by parameter name, LR scheduler, RNG
    adapter/                      the trained adapter in diffusers' LoRA format (pipe.load_lora_weights)
    adapter_ema/                  the EMA adapter, same format

Writing (by the driver alone: workers return tensors and state): everything goes to ``global_step_N.tmp``; every
file and folder there is fsynced, then the manifest is written and fsynced, the checkpoint is read back
(:func:`verify_checkpoint`), renamed to ``global_step_N`` and the parent folder fsynced. Only then are older
checkpoints pruned (``keep_last_n``), and ``.tmp`` folders that earlier crashes left are deleted at the next save.
Re-saving a step (the last one after resuming from it) sets the old ``global_step_N`` aside as ``global_step_N.old``
before renaming the new one in, and deletes it after; a crash in between leaves the ``.old`` copy, which counts as
step N until a save replaces it. A run saved with n actor ranks resumes with any number of ranks.

Order: "newest" means last written, by the UTC time in the manifest (then the step), not the highest step. A run
that went back to step 60 (a resume of an older checkpoint, or a recovery that skipped a broken step 100) and saves
60 in a folder holding 100 continues from 60; ``keep_last_n`` keeps the ``n`` last written, so 100 goes first, and
never prunes the checkpoint just written.

Reading: files are unpickled with ``torch.load(weights_only=True)`` (tensors and plain values only: a checkpoint
from someone else cannot run code), and every failure (a truncated or empty file, an empty or invalid manifest, a
missing file, a bad safetensors file, an object that is not plain data) is a :class:`CheckpointError` naming the
file.

The API the runner uses:

* :func:`save_checkpoint` -- write, verify, then prune.
* :func:`load_checkpoint` -- verify and read one checkpoint, checked against the recipe's model settings.
* :func:`complete_checkpoints` -- one folder's complete checkpoints, oldest first by :func:`save_order`.

Which checkpoint a resume, an in-run restart or an export takes: :mod:`rlrunner.run.checkpoint_index`; whether the
resuming recipe allows it: :mod:`rlrunner.run.checkpointer`.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import yaml

from rlrunner.utils.durable import sync_path, sync_tree, write_synced

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
# 3: actor.pt (one rank-independent state), a UTC save time and every file's size in the manifest, RNG states as
# tensors and plain values (weights_only loading); 2: actor/rank_0.pt; 1: per-rank actor states keyed by index
FORMAT_VERSION = 3
RUNNER_FILE, ACTOR_FILE = "runner.pt", "actor.pt"
ASIDE = ".old"  # suffix of a checkpoint set aside while a re-save of its step is renamed in
WRITING = ".tmp"  # suffix of a checkpoint being written (or of one a crash cut short)
CHECKPOINT_DIR = re.compile(rf"^global_step_(\d+)(?:{re.escape(ASIDE)})?$")
_STALE_DIR = re.compile(rf"^global_step_\d+{re.escape(WRITING)}$")
# adapter name -> its folder in a checkpoint, diffusers' LoRA format (written by the driver from the actor's state)
ADAPTER_DIRS = {"default": "adapter", "ema": "adapter_ema"}


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names what is missing or mismatched."""


def step_dir(root: Path, step: int) -> Path:
    return root / f"global_step_{step}"


def save_checkpoint(root: Path, step: int, *, runner_state: dict[str, Any], actor_state: dict[str, Any],
                    config_yaml: str, model_info: dict[str, Any], write_adapters: Callable[[Path], None],
                    keep_last_n: int = 0) -> Path:
    """Write checkpoint ``step`` durably (module docstring), then prune to the ``keep_last_n`` last written (0
    keeps all). ``actor_state``: the actor's rank-independent state. Returns the checkpoint's folder.

    Raises:
        CheckpointError: the written checkpoint does not read back (nothing is pruned then).
    """
    created = not root.is_dir()
    root.mkdir(parents=True, exist_ok=True)
    for stale in [p for p in root.iterdir() if _STALE_DIR.match(p.name)]:  # saves that a crash cut short
        logger.warning("deleting %s, a checkpoint write that never completed", stale)
        shutil.rmtree(stale, ignore_errors=True)
    final = step_dir(root, step)
    tmp = final.with_name(final.name + WRITING)
    tmp.mkdir()
    (tmp / "config.yaml").write_text(config_yaml)
    torch.save(runner_state, tmp / RUNNER_FILE)
    torch.save(actor_state, tmp / ACTOR_FILE)
    write_adapters(tmp)
    sync_tree(tmp)  # every byte on the disk before the manifest says the checkpoint is complete
    files = {p.relative_to(tmp).as_posix(): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
    manifest = {"format_version": FORMAT_VERSION, "global_step": step,
                "saved_utc": datetime.now(timezone.utc).isoformat(timespec="microseconds"), "files": files,
                **model_info}
    write_synced(tmp / MANIFEST, json.dumps(manifest, indent=2))
    sync_path(tmp)
    verify_checkpoint(tmp)
    aside = final.with_name(final.name + ASIDE)
    if final.exists():  # a re-save of the same step (e.g. after resuming from it): keep the old until the new is in
        shutil.rmtree(aside, ignore_errors=True)
        final.rename(aside)
    tmp.rename(final)
    sync_path(root)
    if created:
        sync_path(root.parent)
    shutil.rmtree(aside, ignore_errors=True)
    if keep_last_n > 0:
        _prune(root, final, keep_last_n)
    return final


def _prune(root: Path, final: Path, keep_last_n: int) -> None:
    """Delete all but the ``keep_last_n`` last written checkpoints of ``root``; ``final`` (just written) stays."""
    older = [c for c in complete_checkpoints(root) if c != final]
    for old in older[:max(0, len(older) - (keep_last_n - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def write_adapters(directory: Path, adapters: dict[str, dict[str, torch.Tensor]], model_cfg: Any) -> None:
    """Both adapters' tensors (the actor's ``state_dict()["adapters"]``) in diffusers' LoRA format, as the model's
    ``save_lora`` writes them, without a model: the driver writes them (``model_cfg``: the recipe's actor.model)."""
    from rlrunner.models import model_class  # the model families' modules load only when a checkpoint is written

    family = model_class(model_cfg.model_type)
    for name, folder in ADAPTER_DIRS.items():
        family.write_lora_files(str(directory / folder), adapters[name], model_cfg[model_cfg.model_type])


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root`` (one run's ``checkpoints/``), oldest first by save time (module
    docstring), one per step: its ``global_step_N``, or the ``global_step_N.old`` that a crash during a re-save of
    step N left instead. Complete means it has a manifest; whether it reads back is :func:`verify_checkpoint`'s
    question."""
    if not root.is_dir():
        return []
    found: dict[int, Path] = {}
    for path in sorted(root.iterdir(), key=lambda p: p.name.endswith(ASIDE)):  # global_step_N before its .old
        if (m := CHECKPOINT_DIR.match(path.name)) and (path / MANIFEST).is_file():
            found.setdefault(int(m.group(1)), path)
    return sorted(found.values(), key=save_order)


def save_order(ckpt: Path) -> tuple[float, int]:
    """``(save time, step)``: the manifest's UTC time; the manifest file's time when it has none or is unreadable
    (a checkpoint cut short by a crash, or of an older format), which still sorts it among the others."""
    step = int(CHECKPOINT_DIR.match(ckpt.name).group(1))
    try:
        return datetime.fromisoformat(json.loads((ckpt / MANIFEST).read_text())["saved_utc"]).timestamp(), step
    except (OSError, ValueError, KeyError, TypeError):
        try:
            return (ckpt / MANIFEST).stat().st_mtime, step
        except OSError:
            return 0.0, step


def read_manifest(ckpt: Path) -> dict[str, Any]:
    """``ckpt``'s manifest, of this rlrunner's format.

    Raises:
        CheckpointError: naming the manifest when it is missing, empty, not a JSON object or of another format.
    """
    file = ckpt / MANIFEST
    if not file.is_file():
        raise CheckpointError(f"{ckpt} is not a complete checkpoint: {MANIFEST} is missing (interrupted save?); "
                              f"use an earlier global_step_N or runner.resume_dir=auto")
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{file} cannot be read: {err}") from None
    if not text.strip():
        raise CheckpointError(f"{file} is empty (a crash before the save reached the disk?)")
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{file} is not valid JSON ({err})") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{file} holds {type(manifest).__name__}, not a JSON object")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {ckpt} has format_version {manifest.get('format_version')}, this rlrunner "
                              f"reads {FORMAT_VERSION}; resume it with the rlrunner version that wrote it")
    return manifest


def _torch_load(file: Path, *, mmap: bool = False) -> Any:
    """Unpickle ``file`` as plain data: tensors, numbers, strings, lists, tuples and dicts, nothing that runs code."""
    if not file.is_file():
        raise CheckpointError(f"checkpoint file {file} is missing")
    try:
        return torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # noqa: BLE001 - bytes from outside: any failure means "this file does not load"
        text = str(err).strip()
        if isinstance(err, pickle.UnpicklingError) and "weights_only" in text.lower():
            reason = "it holds objects other than tensors and plain values, which are never unpickled"
        else:
            reason = text.splitlines()[0] if text else "truncated or empty"
        raise CheckpointError(f"checkpoint file {file} does not load ({type(err).__name__}: {reason})") from None


def _check_opens(file: Path) -> None:
    """Open ``file`` as its kind is read (headers and pickles, no tensor data), or raise CheckpointError."""
    if file.suffix == ".pt":
        _torch_load(file, mmap=True)
        return
    try:
        if file.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(file), framework="pt") as handle:
                list(handle.keys())
        elif file.suffix == ".json":
            json.loads(file.read_text())
        elif file.suffix == ".yaml":
            yaml.safe_load(file.read_text())
    except Exception as err:  # noqa: BLE001 - safetensors' and the parsers' errors share no base class
        raise CheckpointError(f"checkpoint file {file} does not load ({type(err).__name__}: {err})") from None


def verify_checkpoint(ckpt: Path) -> dict[str, Any]:
    """Read ``ckpt`` back cheaply: the manifest, then every file it lists has its recorded size and opens (pickles
    unpickled memory-mapped, safetensors headers parsed). Returns the manifest.

    Raises:
        CheckpointError: naming the first file that is missing, truncated or does not load.
    """
    manifest = read_manifest(ckpt)
    files = manifest.get("files")
    if not isinstance(files, dict) or not {RUNNER_FILE, ACTOR_FILE} <= files.keys():
        raise CheckpointError(f"{ckpt / MANIFEST} does not list {RUNNER_FILE} and {ACTOR_FILE} in 'files'")
    for name, size in files.items():
        file = ckpt / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {ckpt} is missing {name}")
        if file.stat().st_size != size:
            raise CheckpointError(f"checkpoint file {file} has {file.stat().st_size} bytes, its manifest says {size} "
                                  "(cut short by a crash before it reached the disk?)")
        _check_opens(file)
    return manifest


def _same_setting(key: str, saved: Any, expected: Any) -> bool:
    """Whether a manifest's ``key`` matches the resuming recipe's; a relative ``model_path`` (checkpoints written
    before recipe paths were made absolute) is taken from the working directory, as its run took it."""
    if key == "model_path" and isinstance(saved, str) and saved and not os.path.isabs(saved):
        return saved == expected or os.path.normpath(os.path.join(os.getcwd(), saved)) == expected
    return saved == expected


def load_checkpoint(path: Path, model_info: dict[str, Any], actor_world_size: int | None = None) -> dict[str, Any]:
    """Read back and check a checkpoint; returns ``{"manifest", "runner", "actor"}`` (``actor``: one
    rank-independent state, for any number of ranks; ``actor_world_size``, the resuming run's, is only logged).

    Raises:
        CheckpointError: naming the file that does not load, or the model setting that differs from ``model_info``.
    """
    manifest = verify_checkpoint(path)
    for key, expected in model_info.items():
        if not _same_setting(key, manifest.get(key), expected):
            raise CheckpointError(f"checkpoint {path} was made with {key}={manifest.get(key)!r}, this recipe has "
                                  f"{key}={expected!r}; resume with the same model and LoRA settings")
    state, runner = _torch_load(path / ACTOR_FILE), _torch_load(path / RUNNER_FILE)
    if not isinstance(state, dict) or not isinstance(state.get("adapters"), dict) or not isinstance(runner, dict):
        raise CheckpointError(f"checkpoint {path}: {ACTOR_FILE} or {RUNNER_FILE} is not an rlrunner state")
    saved_ranks = state.get("world_size", 1)
    if actor_world_size is not None and saved_ranks != actor_world_size:
        logger.info("checkpoint %s was saved by %d actor rank(s); resuming on %d", path, saved_ranks, actor_world_size)
    if "ema" not in state["adapters"]:
        logger.warning("checkpoint %s has no EMA adapter: EMA restarts from the trained adapter, so this resume is "
                       "NOT exact", path)
        state["adapters"]["ema"] = dict(state["adapters"].get("default", {}))
    return {"manifest": manifest, "runner": runner, "actor": state}
