"""Checkpoints that cannot lie: every file and folder reaches the disk before the manifest, a checkpoint that does
not read back is skipped by auto-resume (with the reason logged) and never causes a prune, "newest" means last
written, stale writes are cleaned, and a checkpoint file is never unpickled into anything but plain data."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path

import pytest
import torch

from rlrunner.run.checkpoint import (
    ACTOR_FILE,
    MANIFEST,
    RUNNER_FILE,
    CheckpointError,
    complete_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from rlrunner.run.checkpoint_index import CheckpointIndex
from rlrunner.run.checkpointer import resume_point

RECIPE = {"runner": {"logger": {"experiment_name": "exp"}, "resume_allow_changes": False}}
CONFIG_YAML = "runner:\n  logger:\n    experiment_name: exp\n  resume_allow_changes: false\n"


def _write_adapter(folder: Path) -> None:
    """An adapter folder as a LoRA export writes it: a nested folder with a safetensors file and a JSON config."""
    from safetensors.torch import save_file

    (folder / "adapter").mkdir()
    save_file({"lora.weight": torch.ones(2, 2)}, folder / "adapter" / "pytorch_lora_weights.safetensors")
    (folder / "adapter" / "adapter_config.json").write_text("{}")


def _save(root: Path, step: int, keep_last_n: int = 0, write_adapters=_write_adapter) -> Path:
    return save_checkpoint(root, step, runner_state={"step": step}, actor_state={"adapters": {"default": {}}},
                           config_yaml=CONFIG_YAML, model_info={"model_type": "tiny"},
                           write_adapters=write_adapters, keep_last_n=keep_last_n)


def test_every_file_and_folder_is_synced_before_the_manifest_and_the_rename_after(tmp_path, monkeypatch):
    synced: list[str] = []
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    root = tmp_path / "checkpoints"
    final = _save(root, 3)
    tmp = str(root / "global_step_3.tmp")
    manifest_at = synced.index(f"{tmp}/{MANIFEST}")
    before = set(synced[:manifest_at])
    written = {str(p).replace(str(final), tmp) for p in final.rglob("*") if p.name != MANIFEST}
    assert written == {f"{tmp}/{name}" for name in ("config.yaml", RUNNER_FILE, ACTOR_FILE, "adapter",
                                                    "adapter/pytorch_lora_weights.safetensors",
                                                    "adapter/adapter_config.json")}
    assert written | {tmp} <= before  # every file, every folder (nested ones too), the checkpoint folder
    # after the manifest: the folder that names it, then the checkpoint's parent once the rename made it final,
    # and the parent's parent, which names the checkpoints folder this save created
    assert synced[manifest_at + 1:] == [tmp, str(root), str(tmp_path)]


def test_a_truncated_newest_checkpoint_makes_auto_resume_fall_back_with_the_reason(tmp_path, caplog):
    root = tmp_path / "logs" / "20260101-000000-exp" / "checkpoints"
    good = _save(root, 1)
    broken = _save(root, 2)
    (broken / ACTOR_FILE).write_bytes(b"")  # what a power loss leaves of a file whose data never reached the disk
    with caplog.at_level(logging.WARNING):
        assert resume_point("auto", tmp_path / "logs", RECIPE) == good
    assert f"skipping checkpoint {broken}: checkpoint file {broken / ACTOR_FILE} has 0 bytes" in caplog.text
    assert CheckpointIndex.of_run(root).newest_loadable()[0] == good
    [skipped] = CheckpointIndex.of_run(root).newest_loadable()[1]
    assert skipped.path == broken and "0 bytes, its manifest says" in skipped.reason
    # the same file at its recorded length but garbled: it does not unpickle, and that is the reason given
    size = json.loads((broken / MANIFEST).read_text())["files"][ACTOR_FILE]
    (broken / ACTOR_FILE).write_bytes(b"\0" * size)
    assert CheckpointIndex.of_run(root).newest_loadable()[0] == good
    with pytest.raises(CheckpointError, match=rf"^checkpoint file {broken / ACTOR_FILE} does not load "):
        load_checkpoint(broken, {"model_type": "tiny"})


@pytest.mark.parametrize("manifest", ["", "{not json", "[]"])
def test_an_empty_or_invalid_manifest_is_skipped_never_a_crash(tmp_path, manifest):
    root = tmp_path / "logs" / "20260101-000000-exp" / "checkpoints"
    good = _save(root, 1)
    broken = _save(root, 2)
    (broken / MANIFEST).write_text(manifest)
    assert CheckpointIndex.of_experiment(tmp_path / "logs", "exp").newest() == broken  # listed (it has a manifest file) ...
    assert resume_point("auto", tmp_path / "logs", RECIPE) == good  # ... but never resumed from
    with pytest.raises(CheckpointError, match=rf"^{broken / MANIFEST} (is empty|is not valid JSON|holds list)"):
        load_checkpoint(broken, {})


def test_auto_resume_refuses_when_no_checkpoint_loads_naming_each(tmp_path):
    root = tmp_path / "logs" / "20260101-000000-exp" / "checkpoints"
    for step in (1, 2):
        (_save(root, step) / RUNNER_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"none of its 2 checkpoint\(s\) loads \(global_step_2: checkpoint .* is "
                                              r"missing runner.pt; global_step_1: .*missing runner.pt\)"):
        resume_point("auto", tmp_path / "logs", RECIPE)


def test_a_save_of_step_60_beside_step_100_keeps_60_the_last_written(tmp_path):
    """A run that went back to step 60 (resumed from it, or recovered past a broken 100) continues from 60."""
    _save(tmp_path, 100)
    newest = _save(tmp_path, 60, keep_last_n=1)
    assert complete_checkpoints(tmp_path) == [newest] and newest.name == "global_step_60"
    _save(tmp_path, 100)
    _save(tmp_path, 60)
    _save(tmp_path, 61, keep_last_n=2)  # the two last written, whatever their steps
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["global_step_60", "global_step_61"]
    assert CheckpointIndex.of_run(tmp_path).newest_loadable()[0].name == "global_step_61"


def test_a_checkpoint_that_does_not_read_back_fails_the_save_and_prunes_nothing(tmp_path):
    kept = _save(tmp_path, 1, keep_last_n=1)

    def truncated_adapter(folder: Path) -> None:
        (folder / "adapter").mkdir()
        (folder / "adapter" / "pytorch_lora_weights.safetensors").write_bytes(b"\x10\0\0\0\0\0\0\0{")

    with pytest.raises(CheckpointError, match=r"pytorch_lora_weights.safetensors does not load"):
        _save(tmp_path, 2, keep_last_n=1, write_adapters=truncated_adapter)
    assert complete_checkpoints(tmp_path) == [kept]


def test_stale_writes_of_earlier_crashes_are_deleted_at_the_next_save(tmp_path):
    for stale in ("global_step_7.tmp", "global_step_9.tmp"):  # a crash mid-save leaves these behind
        (tmp_path / stale / "adapter").mkdir(parents=True)
        (tmp_path / stale / RUNNER_FILE).write_bytes(b"partial")
    (tmp_path / "notes.tmp").mkdir()  # not a checkpoint's: left alone
    _save(tmp_path, 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_10", "notes.tmp"]


class _RunsCode:
    """Unpickling this calls ``Path.touch(marker)``: what a hostile checkpoint does with ``os.system``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_a_checkpoint_file_that_would_run_code_is_refused_and_the_code_never_runs(tmp_path):
    ckpt = _save(tmp_path, 1)
    marker = tmp_path / "code_ran"
    torch.save({"step": 1, "rng": _RunsCode(marker)}, ckpt / RUNNER_FILE)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    manifest["files"][RUNNER_FILE] = (ckpt / RUNNER_FILE).stat().st_size  # a well-formed manifest, as an attacker's
    (ckpt / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=rf"^checkpoint file {ckpt / RUNNER_FILE} does not load \(UnpicklingError: "
                                              r"it holds objects other than tensors and plain values"):
        load_checkpoint(ckpt, {"model_type": "tiny"})
    assert CheckpointIndex.of_run(tmp_path).newest_loadable()[0] is None
    assert not marker.exists()


def test_an_older_format_is_refused_with_one_line(tmp_path):
    ckpt = _save(tmp_path, 1)
    (ckpt / MANIFEST).write_text(json.dumps({"format_version": 2, "global_step": 1, "actor_world_size": 1}))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(ckpt, {})
    assert str(err.value) == (f"checkpoint {ckpt} has format_version 2, this rlrunner reads 3; resume it with the "
                              "rlrunner version that wrote it")


def _refusing_directory_fsync(monkeypatch, code: int) -> list[str]:
    """os.fsync as a CIFS/SMB or FUSE mount answers it: ``code`` for a folder, a real fsync for a file. Returns the
    folders refused."""
    from rlrunner.utils import durable

    monkeypatch.setattr(durable, "_warned_refusal", False)  # a fresh process, whatever earlier tests did
    fsync, refused = os.fsync, []

    def fsync_files_only(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            refused.append(os.readlink(f"/proc/self/fd/{fd}"))
            raise OSError(code, os.strerror(code))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_files_only)
    return refused


def test_a_filesystem_that_refuses_to_fsync_folders_is_warned_about_once_and_the_save_completes(
        tmp_path, monkeypatch, caplog):
    refused = _refusing_directory_fsync(monkeypatch, errno.EINVAL)
    root = tmp_path / "logs" / "20260101-000000-exp" / "checkpoints"
    with caplog.at_level(logging.WARNING, logger="rlrunner.utils.durable"):
        first, second = _save(root, 1), _save(root, 2)
    assert len(refused) > 4  # every folder of both saves was asked
    [warning] = caplog.records  # once per process, not once per folder or per save
    assert warning.getMessage() == (f"the filesystem of {refused[0]} refuses to fsync a folder (Invalid argument): "
                                    "writes there go on, but their durability across a power loss is not "
                                    "guaranteed there")
    assert complete_checkpoints(root) == [first, second]
    assert load_checkpoint(second, {"model_type": "tiny"})["runner"] == {"step": 2}
    assert resume_point("auto", tmp_path / "logs", RECIPE) == second


def test_other_fsync_errors_of_a_folder_still_end_the_save(tmp_path, monkeypatch):
    _refusing_directory_fsync(monkeypatch, errno.EIO)  # a disk that fails: no checkpoint must claim to be durable
    with pytest.raises(OSError, match="Input/output error"):
        _save(tmp_path, 1)
    assert complete_checkpoints(tmp_path) == []
