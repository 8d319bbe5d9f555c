"""Checkpoints: exact resume (EMA included), crash safety, fallbacks, mismatch errors, pruning, export."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from runner_helpers import small_recipe, train_metrics
from safetensors.torch import load_file

from rlrunner.commands.export import main as export_main
from rlrunner.config.errors import RecipeError
from rlrunner.run.checkpoint import ACTOR_FILE, CheckpointError, complete_checkpoints, load_checkpoint, save_checkpoint
from rlrunner.run.runner import Runner, run

ROOT = Path(__file__).resolve().parents[2]
HELPERS = ROOT / "tests" / "helpers"  # runner_helpers, for the scripts run in a subprocess
MODEL_INFO_KEYS = ("model_type", "model_path", "lora_rank", "lora_alpha")


def _run(root: Path, name: str, *overrides: str) -> Path:
    log_dir = root / "logs" / name
    log_dir.mkdir(parents=True)
    run(small_recipe(root, *overrides), log_dir)
    return log_dir


def _run_interrupted(monkeypatch, stop_at: int, root: Path, name: str, *overrides: str) -> None:
    """A run stopped by Ctrl-C when it reaches global step ``stop_at`` (after that step's checkpoint)."""
    original = Runner.train_step

    def interrupt(self):
        if self.step == stop_at:
            raise KeyboardInterrupt
        return original(self)

    with monkeypatch.context() as patch:
        patch.setattr(Runner, "train_step", interrupt)
        with pytest.raises(KeyboardInterrupt):
            _run(root, name, *overrides)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    return _run(root, "20260101-000000-full", "runner.max_steps=6", "runner.save_interval=3")


def _assert_same_checkpoint(a: Path, b: Path) -> None:
    state_a, state_b = (torch.load(p / ACTOR_FILE, weights_only=True) for p in (a, b))
    for adapter in ("default", "ema"):
        for key, tensor in state_a["adapters"][adapter].items():
            assert torch.equal(tensor, state_b["adapters"][adapter][key]), f"{adapter} {key}"
    opt_a, opt_b = state_a["optimizer"]["state"], state_b["optimizer"]["state"]
    assert opt_a.keys() == opt_b.keys()
    for index in opt_a:
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt_a[index][key], opt_b[index][key]), f"optimizer state {index} {key}"
    assert state_a["lr_scheduler"] == state_b["lr_scheduler"]


def test_resume_continues_exactly_like_an_uninterrupted_run(uninterrupted, monkeypatch):
    """3 steps, stop, resume for 3 more → bitwise the same adapters, EMA, optimizer and logged rewards."""
    root = uninterrupted.parents[1]
    _run_interrupted(monkeypatch, 3, root, "20260101-000001-part", "runner.max_steps=6", "runner.save_interval=3")
    first_half = root / "logs" / "20260101-000001-part"
    resumed = _run(root, "20260101-000002-resumed", "runner.max_steps=6", "runner.save_interval=3",
                   f"runner.resume_dir={first_half / 'checkpoints' / 'global_step_3'}")
    _assert_same_checkpoint(uninterrupted / "checkpoints/global_step_6", resumed / "checkpoints/global_step_6")
    full, second = train_metrics(uninterrupted), train_metrics(resumed)
    assert [m["step"] for m in second] == [4, 5, 6]
    for ours, reference in zip(second, full[3:]):
        for key in ("env/avg", "train/actor/nft_loss", "train/actor/grad_norm", "train/actor/ema_tau"):
            assert ours[key] == reference[key], key


@pytest.mark.slow
def test_sigkill_during_checkpoint_write_resumes_from_previous_complete(uninterrupted, tmp_path):
    """A crash while global_step_4 is written leaves global_step_2 as the newest; auto-resume continues exactly."""
    flag = tmp_path / "writing"
    script = f"""
import sys, time
sys.path.insert(0, {str(HELPERS)!r})
from pathlib import Path
import rlrunner.run.checkpointer as runner_module
from rlrunner.run.runner import run
from runner_helpers import small_recipe
original = runner_module.save_checkpoint
def slow_save(root, step, **kwargs):
    if step == 4:
        write = kwargs["write_adapters"]
        def write_then_hang(directory):
            write(directory)
            Path({str(flag)!r}).touch()
            time.sleep(600)
        kwargs["write_adapters"] = write_then_hang
    return original(root, step, **kwargs)
runner_module.save_checkpoint = slow_save
root = Path({str(tmp_path)!r})
log_dir = root / "logs" / "20260101-000000-crash"
log_dir.mkdir(parents=True)
run(small_recipe(root, "runner.max_steps=6", "runner.save_interval=2"), log_dir)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    deadline = time.monotonic() + 300
    while not flag.exists():
        assert proc.poll() is None, "training process ended before the checkpoint write"
        assert time.monotonic() < deadline, "timed out waiting for the checkpoint write"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    crashed = tmp_path / "logs" / "20260101-000000-crash" / "checkpoints"
    assert (crashed / "global_step_4.tmp").is_dir() and not (crashed / "global_step_4").exists()
    assert [p.name for p in complete_checkpoints(crashed)] == ["global_step_2"]
    resumed = _run(tmp_path, "20260101-000001-crash", "runner.max_steps=6", "runner.save_interval=2",
                   "runner.resume_dir=auto")
    assert [m["step"] for m in train_metrics(resumed)] == [3, 4, 5, 6]
    _assert_same_checkpoint(uninterrupted / "checkpoints/global_step_6", resumed / "checkpoints/global_step_6")


def test_checkpoint_without_ema_falls_back_with_a_warning(uninterrupted, tmp_path, caplog):
    ckpt = shutil.copytree(uninterrupted / "checkpoints/global_step_3", tmp_path / "global_step_3")
    state = torch.load(ckpt / ACTOR_FILE, weights_only=True)
    del state["adapters"]["ema"]
    torch.save(state, ckpt / ACTOR_FILE)
    manifest = __import__("json").loads((ckpt / "manifest.json").read_text())
    manifest["files"][ACTOR_FILE] = (ckpt / ACTOR_FILE).stat().st_size  # the edit, recorded where a save records it
    (ckpt / "manifest.json").write_text(__import__("json").dumps(manifest))
    info = {k: manifest[k] for k in MODEL_INFO_KEYS}
    with caplog.at_level(logging.WARNING):
        loaded = load_checkpoint(ckpt, info, actor_world_size=1)
    assert "NOT exact" in caplog.text
    adapters = loaded["actor"]["adapters"]
    assert all(torch.equal(adapters["ema"][k], adapters["default"][k]) for k in adapters["default"])


def test_mismatched_or_partial_checkpoints_are_rejected_by_name(uninterrupted, tmp_path):
    ckpt = uninterrupted / "checkpoints/global_step_3"
    manifest = __import__("json").loads((ckpt / "manifest.json").read_text())
    info = {k: manifest[k] for k in MODEL_INFO_KEYS}
    with pytest.raises(CheckpointError, match=r"lora_rank=4, this recipe has lora_rank=8"):
        load_checkpoint(ckpt, {**info, "lora_rank": 8}, actor_world_size=1)
    old_format = shutil.copytree(ckpt, tmp_path / "old" / "global_step_3")
    (old_format / "manifest.json").write_text(__import__("json").dumps({**manifest, "format_version": 1}))
    with pytest.raises(CheckpointError, match=r"has format_version 1, this rlrunner reads 3"):
        load_checkpoint(old_format, info, actor_world_size=1)
    partial = shutil.copytree(ckpt, tmp_path / "global_step_3")
    (partial / ACTOR_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"global_step_3 is missing actor.pt"):
        load_checkpoint(partial, info, actor_world_size=1)
    (partial / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=r"manifest.json is missing"):
        load_checkpoint(partial, info, actor_world_size=1)
    root = uninterrupted.parents[1]
    with pytest.raises(Exception, match=r"lora_rank"):
        _run(root, "20260101-000009-bad", "runner.max_steps=6", "actor.model.tiny.lora_rank=8",
             "actor.model.tiny.lora_alpha=4", f"runner.resume_dir={ckpt}")


def test_auto_resume_without_a_checkpoint_starts_from_scratch(uninterrupted, tmp_path, caplog):
    """A run preempted before its first save is re-issued with the same command line and starts over."""
    with caplog.at_level(logging.WARNING, logger="rlrunner"):
        fresh = _run(tmp_path, "20260101-000000-preempted", "runner.max_steps=2", "runner.resume_dir=auto")
    assert "no complete checkpoint" in caplog.text and "starting from scratch" in caplog.text
    full = [m["env/avg"] for m in train_metrics(uninterrupted)[:2]]
    assert [m["env/avg"] for m in train_metrics(fresh)] == full
    # an explicit path that does not exist is a recipe error, before anything starts
    with pytest.raises(RecipeError, match=r"runner.resume_dir='.*nowhere' does not exist; give an existing folder or "
                                          r"'' or 'auto'"):
        _run(tmp_path, "20260101-000001-preempted", "runner.max_steps=2", f"runner.resume_dir={tmp_path / 'nowhere'}")


def test_keep_last_n_prunes_old_checkpoints(tmp_path):
    for step in range(1, 5):
        save_checkpoint(tmp_path, step, runner_state={"step": step}, actor_state={}, config_yaml="",
                        model_info={}, write_adapters=lambda d: None, keep_last_n=2)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["global_step_3", "global_step_4"]
    assert not list(tmp_path.glob("*.tmp"))


def test_export_writes_a_diffusers_lora_folder(uninterrupted, tmp_path, capsys):
    out = tmp_path / "exported"
    assert export_main([str(uninterrupted), "--out", str(out), "--adapter", "ema"]) == 0
    exported = load_file(out / "pytorch_lora_weights.safetensors")
    original = load_file(uninterrupted / "checkpoints/global_step_6/adapter_ema/pytorch_lora_weights.safetensors")
    assert exported.keys() == original.keys() and all(torch.equal(exported[k], original[k]) for k in exported)
    assert "no diffusers pipeline" in (out / "README.md").read_text()  # the tiny model loads with rlrunner
    assert export_main([str(tmp_path / "nothing"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_rollout_ahead_resumes_exactly(tmp_path, monkeypatch):
    """With the next rollout started during the update, a resume replays it with the adapters that sampled it."""
    ahead = ("runner.max_steps=4", "runner.save_interval=2", "runner.rollout_ahead=true")
    full = _run(tmp_path, "20260101-000000-ahead", *ahead)
    _run_interrupted(monkeypatch, 2, tmp_path, "20260101-000001-ahead", *ahead)
    partial = tmp_path / "logs" / "20260101-000001-ahead" / "checkpoints" / "global_step_2"
    resumed = _run(tmp_path, "20260101-000002-ahead", *ahead, f"runner.resume_dir={partial}")
    assert [m["step"] for m in train_metrics(resumed)] == [3, 4]
    assert "time/rollout_ahead" not in train_metrics(full)[0]
    assert all("time/rollout_ahead" in m for m in train_metrics(full)[1:])
    for ours, reference in zip(train_metrics(resumed), train_metrics(full)[2:]):
        assert ours["env/avg"] == reference["env/avg"] and ours["train/actor/nft_loss"] == reference["train/actor/nft_loss"]
    _assert_same_checkpoint(full / "checkpoints/global_step_4", resumed / "checkpoints/global_step_4")


@pytest.mark.ray
@pytest.mark.slow
def test_resume_through_ray_continues_an_in_process_run_exactly(uninterrupted, tmp_path):
    """A checkpoint is backend-independent: Ray actors pick up an in-process run's step 3 and match its step 6."""
    step3 = uninterrupted / "checkpoints" / "global_step_3"
    resumed = _run(uninterrupted.parents[1], "20260101-000003-ray", "runner.max_steps=6", "runner.save_interval=3",
                   "cluster.backend=ray", "cluster.num_devices_per_node=3", "cluster.worker_timeout_s=120",
                   "cluster.component_placement={actor: 0, rollout: 1, env: 2}", f"runner.resume_dir={step3}")
    assert [m["step"] for m in train_metrics(resumed)] == [4, 5, 6]
    _assert_same_checkpoint(uninterrupted / "checkpoints/global_step_6", resumed / "checkpoints/global_step_6")


KILLED_RUN = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
import rlrunner.run.checkpointer as runner_module
from rlrunner.run.runner import Runner, run
from runner_helpers import small_recipe
kill_step, phase, root, name = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
def die():
    os.kill(os.getpid(), signal.SIGKILL)
if phase == "save":  # after the adapters are written, before the checkpoint is marked complete
    original_save = runner_module.save_checkpoint
    def save(ckpt_root, step, **kwargs):
        if step == kill_step:
            write = kwargs["write_adapters"]
            kwargs["write_adapters"] = lambda directory: (write(directory), die())
        return original_save(ckpt_root, step, **kwargs)
    runner_module.save_checkpoint = save
else:  # "rollout": after step kill_step's samples are scored; "update": after its optimizer step, before the EMA
    method = {{"rollout": "rollout_and_score", "update": "update"}}[phase]
    original = getattr(Runner, method)
    def killing(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if self.step + 1 == kill_step:
            die()
        return out
    setattr(Runner, method, killing)
log_dir = root / "logs" / name
log_dir.mkdir(parents=True)
run(small_recipe(root, *sys.argv[5:]), log_dir)
"""


@pytest.mark.slow
def test_sigkill_at_random_moments_then_auto_resume_ends_bitwise_like_an_uninterrupted_run(uninterrupted, tmp_path):
    """Three SIGKILLs at seeded random (step, phase) moments, one of them inside a checkpoint write; the same command
    line with runner.resume_dir=auto is re-issued after each, and the last run's adapters equal the reference's."""
    import random

    rng = random.Random(17)
    save_step = rng.choice([2, 4, 6])  # runner.save_interval=2
    steps = sorted([save_step, *rng.sample([s for s in range(1, 7) if s != save_step], 2)])
    kills = [(step, "save" if step == save_step else rng.choice(["rollout", "update"])) for step in steps]
    # no evals (they change no training state), so the four processes spend their time on steps
    overrides = ["runner.max_steps=6", "runner.save_interval=2", "runner.resume_dir=auto", "runner.val_before_train=false",
                 "runner.val_check_interval=0"]
    script = KILLED_RUN.format(tests=str(HELPERS))
    for attempt, (step, phase) in enumerate(kills):
        name = f"20260101-00000{attempt}-kill"
        proc = subprocess.run([sys.executable, "-c", script, str(step), phase, str(tmp_path), name, *overrides],
                              check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == -signal.SIGKILL, f"kill at step {step} ({phase}) did not happen: {proc.stderr}"
        checkpoints = tmp_path / "logs" / name / "checkpoints"
        complete = [p.name for p in complete_checkpoints(checkpoints)] if checkpoints.exists() else []
        assert f"global_step_{step}" not in complete  # killed before that step's checkpoint was complete
        if phase == "save":
            assert (checkpoints / f"global_step_{step}.tmp").is_dir()
    final = _run(tmp_path, "20260101-000009-kill", *overrides)
    _assert_same_checkpoint(uninterrupted / "checkpoints/global_step_6", final / "checkpoints/global_step_6")
    reference = {m["step"]: m["env/avg"] for m in train_metrics(uninterrupted)}
    assert all(m["env/avg"] == reference[m["step"]] for m in train_metrics(final))
