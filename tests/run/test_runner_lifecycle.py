"""The runner's life around the steps: trackers opened only after a resume is accepted and closed last with the run's
status, the run's own error kept, exact or refused resumes, and a SIGTERM that saves and exits with status 4."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from runner_helpers import SMALL_OVERRIDES, assert_same_adapters, run_small, small_recipe, train_metrics
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlrunner.commands.train import EXIT_PREEMPTED
from rlrunner.run.checkpoint import CheckpointError, complete_checkpoints
from rlrunner.run.runner import Runner, run
from rlrunner.workers.reward import RewardWorker

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["runner.val_before_train=false", "runner.val_check_interval=0", "runner.sample_log_interval=0"]


def _run(root: Path, name: str, *overrides: str) -> Path:
    return run_small(root, name, *QUIET, *overrides)


def test_a_failed_run_raises_its_own_error_and_still_closes_its_trackers(tmp_path, monkeypatch):
    """The step fails, then the env workers' close fails too: the step's error propagates, TensorBoard holds the
    steps before it, and mlflow records the run as FAILED."""
    mlflow = pytest.importorskip("mlflow", reason="mlflow-skinny is not installed")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    original = Runner.train_step

    def fails_in_step_2(self):
        if self.step == 1:
            raise RuntimeError("the step's own error")
        return original(self)

    def close(self):
        raise ConnectionError("reward service gone")

    monkeypatch.setattr(Runner, "train_step", fails_in_step_2)
    monkeypatch.setattr(RewardWorker, "close", close)
    with pytest.raises(RuntimeError, match="^the step's own error$"):
        _run(tmp_path, "failed", "runner.max_steps=3", "runner.logger.logger_backends=[tensorboard,mlflow]")
    log_dir = tmp_path / "logs" / "failed"
    events = EventAccumulator(str(log_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("env/avg")] == [1]
    client = mlflow.tracking.MlflowClient(tracking_uri=f"file:{log_dir / 'mlruns'}")
    (tracked,) = client.search_runs([client.get_experiment_by_name("rlrunner").experiment_id])
    assert tracked.info.status == "FAILED"


@pytest.fixture(scope="module")
def cosine_run(tmp_path_factory) -> Path:
    """2 steps on a cosine LR schedule, a checkpoint after each."""
    return _run(tmp_path_factory.mktemp("cosine"), "20260101-000000-cosine", "runner.max_steps=2",
                "runner.save_interval=1", "actor.optim.lr_scheduler=cosine")


def test_a_longer_run_on_a_length_dependent_lr_schedule_is_refused_before_any_tracker_opens(cosine_run):
    root = cosine_run.parents[1]
    with pytest.raises(CheckpointError, match=r"global_step_2 was trained on a cosine LR schedule 4 optimizer steps "
                                              r"long; this recipe's run length makes it 6, which changes every "
                                              r"learning rate from here on; resume with the checkpoint's "
                                              r"runner.max_steps \(or max_epochs\), a constant"):
        _run(root, "20260101-000001-longer", "runner.max_steps=3", "actor.optim.lr_scheduler=cosine",
             "runner.resume_dir=auto")
    refused = root / "logs" / "20260101-000001-longer"
    assert not (refused / "tensorboard").exists() and not (refused / "metrics.jsonl").exists()
    # accepted when asked: the schedule then has the new length
    resumed = _run(root, "20260101-000002-longer", "runner.max_steps=3", "actor.optim.lr_scheduler=cosine",
                   "runner.resume_dir=auto", "runner.resume_allow_changes=[runner.max_steps]")
    assert [m["step"] for m in train_metrics(resumed)] == [3]


def test_another_number_of_rollout_ranks_is_refused(cosine_run, tmp_path):
    """A checkpoint rolled out by 2 rollout ranks (rollout noise is drawn per rank) cannot go on with 1."""
    checkpoint = tmp_path / "global_step_1"
    shutil.copytree(cosine_run / "checkpoints" / "global_step_1", checkpoint)
    state = torch.load(checkpoint / "runner.pt", weights_only=False)
    torch.save({**state, "rollout_world_size": 2}, checkpoint / "runner.pt")
    with pytest.raises(CheckpointError, match=r"global_step_1 was rolled out by 2 rollout rank\(s\), this placement "
                                              r"has 1: rollout noise is drawn per rollout rank, so the run would not "
                                              r"go on as it would have; place 2 rollout rank\(s\)"):
        _run(cosine_run.parents[1], "20260101-000003-ranks", "runner.max_steps=2", "actor.optim.lr_scheduler=cosine",
             f"runner.resume_dir={checkpoint}")


def test_the_same_rollout_groups_on_other_ranks_resume_and_go_on_as_the_saved_run(cosine_run, tmp_path):
    """Rollout noise is seeded per rollout group: a checkpoint rolled out by 2 ranks in one context-parallel group
    (rollout.context_parallel_size=2) goes on with 1 rank as the saved run would have, once the recipe key is
    accepted; the ranks alone (2 against 1) said nothing about the noise."""
    checkpoint = tmp_path / "global_step_1"
    shutil.copytree(cosine_run / "checkpoints" / "global_step_1", checkpoint)
    state = torch.load(checkpoint / "runner.pt", weights_only=False)
    torch.save({**state, "rollout_world_size": 2}, checkpoint / "runner.pt")
    config = checkpoint / "config.yaml"
    saved = config.read_text()
    assert "rollout:\n  context_parallel_size: 1\n" in saved
    config.write_text(saved.replace("rollout:\n  context_parallel_size: 1\n", "rollout:\n  context_parallel_size: 2\n"))
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    for name in ("runner.pt", "config.yaml"):
        manifest["files"][name] = (checkpoint / name).stat().st_size
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    resumed = _run(cosine_run.parents[1], "20260101-000004-groups", "runner.max_steps=2",
                   "actor.optim.lr_scheduler=cosine", f"runner.resume_dir={checkpoint}",
                   "runner.resume_allow_changes=[rollout.context_parallel_size]")
    assert [m["env/avg"] for m in train_metrics(resumed)] == [m["env/avg"] for m in train_metrics(cosine_run)][1:]


@pytest.mark.slow
def test_resume_between_weight_syncs_rolls_out_with_the_adapters_of_the_last_sync(tmp_path):
    """runner.weight_sync_interval=2: step 2 rolls out with step 0's adapters; a resume from step 1 must too."""
    sync = ("runner.weight_sync_interval=2", "runner.max_steps=3", "runner.save_interval=1")
    reference = _run(tmp_path, "20260101-000000-sync", *sync)
    resumed = _run(tmp_path, "20260101-000001-sync", *sync,
                   f"runner.resume_dir={reference / 'checkpoints' / 'global_step_1'}")
    assert_same_adapters(resumed / "checkpoints" / "global_step_3", reference / "checkpoints" / "global_step_3")
    assert [m["env/avg"] for m in train_metrics(resumed)] == [m["env/avg"] for m in train_metrics(reference)][1:]


@pytest.mark.slow
def test_sigterm_mid_step_saves_a_checkpoint_exits_4_and_auto_resume_ends_like_an_uninterrupted_run(tmp_path):
    common = [*QUIET, "runner.max_steps=4", "runner.save_interval=0"]  # saves only at the end (and on a signal)
    reference = tmp_path / "reference"
    reference.mkdir()
    run(small_recipe(tmp_path, *common), reference)
    log_dir = tmp_path / "logs" / "20260101-000000-tiny_nft_ocr"
    paths = [f"actor.model.model_path={tmp_path / 'model'}", f"env.train.dataset.path={tmp_path / 'data'}",
             f"env.eval.dataset.path={tmp_path / 'data'}", f"runner.logger.log_path={tmp_path / 'logs'}"]
    command = [sys.executable, "-m", "rlrunner.commands.train", "--config-name", "tiny_nft_ocr", "--log-dir", str(log_dir),
               *SMALL_OVERRIDES, *paths, *common]
    with open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 300
        while not ((log_dir / "metrics.jsonl").exists() and train_metrics(log_dir)):
            assert proc.poll() is None, (tmp_path / "stderr").read_text()
            assert time.monotonic() < deadline, "no step finished in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # step 2 is under way
        status = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    console = (tmp_path / "stderr").read_text()
    assert status == EXIT_PREEMPTED == 4, console
    (saved,) = complete_checkpoints(log_dir / "checkpoints")
    step = int(saved.name.rsplit("_", 1)[1])
    assert 1 <= step < 4 and [m["step"] for m in train_metrics(log_dir)] == list(range(1, step + 1))
    assert console.strip().splitlines()[-1] == (
        f"rlrunner: stopped by SIGTERM after step {step} (checkpoint saved to {saved}); relaunch the same command "
        "with runner.resume_dir=auto to go on")
    resumed = _run(tmp_path, "20260101-000001-tiny_nft_ocr", "runner.max_steps=4", "runner.save_interval=0",
                   "runner.resume_dir=auto")
    assert [m["step"] for m in train_metrics(resumed)] == list(range(step + 1, 5))
    assert_same_adapters(resumed / "checkpoints" / "global_step_4", reference / "checkpoints" / "global_step_4")


def _ray_processes(driver: int) -> tuple[list, list]:
    """The processes the launcher ``driver`` started for Ray: its workers (``ray::WorkerHost``, the actors of
    :mod:`rlrunner.cluster.ray_host`) and everything else under it, Ray's own services (gcs_server, raylet, their
    agents and monitors) and idle workers; found by PID, so no other Ray on this machine is touched."""
    import psutil

    workers, services = [], []
    for child in psutil.Process(driver).children(recursive=True):
        try:
            (workers if child.cmdline()[:1] and child.cmdline()[0].startswith("ray::WorkerHost") else services).append(
                child)
        except psutil.Error:  # gone meanwhile
            pass
    return workers, services


def _names(processes: list) -> set[str]:
    import psutil

    names = set()
    for process in processes:
        with contextlib.suppress(psutil.Error):
            names.add(Path(process.cmdline()[0]).name)
    return names


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("reached", ["workers", "services"])
def test_sigterm_that_reaches_the_ray_workers_too_exits_4_and_says_what_was_lost(tmp_path, reached):
    """Slurm's GraceTime (or scancel without -b) signals the driver and its workers together (``workers``), or every
    process of the job, the services of the Ray the driver started included (``services``: GCS, raylet). The step
    in flight dies with the workers, nothing can be saved, and the run still ends preempted with status 4 (so
    requeue-on-4 fires), saying which step the newest checkpoint holds and how many finished steps are lost; without
    its GCS, the driver's teardown must not wait on it, so it ends well before Ray's core worker gives up on the GCS
    (60 s) and ends the process with status 1."""
    import psutil

    small_recipe(tmp_path)  # the tiny model and prompts
    log_dir = tmp_path / "logs" / "20260101-000000-tiny_nft_ocr"
    paths = [f"actor.model.model_path={tmp_path / 'model'}", f"env.train.dataset.path={tmp_path / 'data'}",
             f"env.eval.dataset.path={tmp_path / 'data'}", f"runner.logger.log_path={tmp_path / 'logs'}"]
    ray_workers = ["cluster.backend=ray", "cluster.num_devices_per_node=3", "cluster.worker_timeout_s=120",
                   "cluster.component_placement={actor: 0, rollout: 1, env: 2}"]
    command = [sys.executable, "-m", "rlrunner.commands.train", "--config-name", "tiny_nft_ocr", "--log-dir", str(log_dir),
               *SMALL_OVERRIDES, *paths, *QUIET, "runner.max_steps=50", "runner.save_interval=0", *ray_workers]
    with open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ""})
    workers, services = [], []
    try:
        deadline = time.monotonic() + 300
        while not ((log_dir / "metrics.jsonl").exists() and len(train_metrics(log_dir)) >= 2):
            assert proc.poll() is None, (tmp_path / "stderr").read_text()
            assert time.monotonic() < deadline, "no step finished in time"
            time.sleep(0.05)
        workers, services = _ray_processes(proc.pid)
        assert workers, "no Ray worker processes under the driver"
        if reached == "services":
            assert {"gcs_server", "raylet"} <= _names(services), _names(services)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # step 3 or 4 is under way; then the rest of the job gets it too
        for process in workers + (services if reached == "services" else []):
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=300)
        seconds = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
        if reached == "services":
            for process in workers + services:  # what the signal left of the Ray this test's driver started
                with contextlib.suppress(psutil.Error):
                    process.kill()
    console = (tmp_path / "stderr").read_text()
    print(f"the driver exited {seconds:.1f} s after the signal")
    assert status == EXIT_PREEMPTED == 4, console
    if reached == "services":
        assert seconds < 40, f"the driver took {seconds:.1f} s to exit after the signal\n{console}"
    assert complete_checkpoints(log_dir / "checkpoints") == []  # save_interval: 0, and the workers were gone
    finished = [m["step"] for m in train_metrics(log_dir)][-1]
    assert console.strip().splitlines()[-1].startswith(
        f"rlrunner: stopped by SIGTERM in step {finished + 1}: the workers got the signal too (")
    assert console.strip().splitlines()[-1].endswith(
        f"); no checkpoint yet, {finished} finished step(s) lost; relaunch the same command with "
        "runner.resume_dir=auto to go on")
