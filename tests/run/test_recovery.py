"""Recovery inside the run (runner.max_restarts): which failures restart, and a real Ray run whose actor, rollout and
env worker processes are SIGKILLed in turn finishes by itself with the adapters of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from runner_helpers import read_metrics, small_recipe, train_metrics

from rlrunner.cluster import CollectiveFailed, WorkerError, WorkerLost, WorkerTimedOut, create_cluster
from rlrunner.run.checkpoint import complete_checkpoints
from rlrunner.run.preemption import WorkersStopped
from rlrunner.run.recovery import RestartPolicy, failure_cause
from rlrunner.run.runner import Runner, run
from rlrunner.run.supervisor import supervise

QUIET = ["runner.val_before_train=false", "runner.val_check_interval=0", "runner.sample_log_interval=0",
         "runner.save_interval=1", "runner.max_steps=4"]


def _lost(role: str = "actor") -> WorkerLost:
    return WorkerLost(role, 0, "10.0.0.7", "died during 'update' (its process exited or was killed)")


def test_failures_are_classified_by_their_type_not_their_text():
    assert failure_cause(_lost()) == "worker_lost"
    assert failure_cause(WorkerTimedOut("env", 1, "10.0.0.7", "did not finish 'collect'")) == "worker_timeout"
    assert failure_cause(CollectiveFailed("actor", 1, "10.0.0.7", "raised in 'update': DistBackendError")) == \
        "collective_failed"
    # a worker whose code raised fails again on new workers, whatever its message says
    assert failure_cause(WorkerError("actor", 0, "10.0.0.7", "died during 'update' (its process exited)")) is None
    assert failure_cause(RuntimeError("ActorDiedError: the actor died")) is None


def test_restarts_are_counted_and_a_failure_at_the_same_step_stops_the_run():
    policy = RestartPolicy(3)
    first = policy.admit(_lost(), step_failed_at=4)
    assert (first.number, first.cause, first.exception, first.node, first.step_failed_at) == \
        (1, "worker_lost", "WorkerLost", "10.0.0.7", 4)
    assert first.worker == "actor worker rank 0 on 10.0.0.7 died during 'update' (its process exited or was killed)"
    assert policy.admit(_lost("env"), step_failed_at=4) is None
    assert policy.refusal == "not restarting: step 4 failed again after a restart (the step itself breaks the workers)"
    assert policy.admit(_lost(), step_failed_at=6).number == 2
    assert policy.admit(WorkerError("env", 0, "10.0.0.7", "raised in 'collect': KeyError"), 9) is None
    assert policy.refusal == ""  # not a kind a restart cures: the error speaks for itself
    assert policy.admit(_lost(), step_failed_at=9).number == 3
    assert policy.admit(_lost(), step_failed_at=12) is None
    assert policy.refusal == "not restarting: runner.max_restarts=3 restart(s) spent"
    never = RestartPolicy(0)
    assert never.admit(_lost(), 1) is None and never.refusal == ""  # 0: stop as before, no extra line
    with pytest.raises(ValueError, match=r"^runner.max_restarts must be >= 0 \(0 = stop at the first failure\), "
                                         r"got -1$"):
        RestartPolicy(-1)


@pytest.mark.slow
def test_a_failure_that_repeats_at_the_same_step_stops_after_one_restart(tmp_path, capsys):
    """In-process workers, a step that loses a worker every time it runs: one restart, then the original error."""
    cfg = small_recipe(tmp_path, *QUIET, "runner.max_steps=3")
    log_dir = tmp_path / "logs" / "run"
    log_dir.mkdir(parents=True)

    class BreaksAtStep2(Runner):
        def train_step(self):
            if self.step == 1:
                raise _lost("rollout")
            return super().train_step()

    with create_cluster(cfg.cluster) as cluster, pytest.raises(WorkerLost, match="rollout worker rank 0"):
        supervise(cluster, cfg, log_dir, lambda resume_dir, logger: BreaksAtStep2(
            cfg, log_dir, cluster, resume_dir=resume_dir, run_logger=logger))
    (restart,) = [json.loads(line) for line in (log_dir / "restarts.jsonl").read_text().splitlines()]
    assert (restart["step_failed_at"], restart["step_resumed_from"], restart["lost_steps"]) == (2, 1, 0)
    assert "rlrunner: not restarting: step 2 failed again after a restart" in capsys.readouterr().err
    assert [m["step"] for m in train_metrics(log_dir)] == [1]


def test_a_run_asked_to_stop_does_not_restart_its_lost_workers(tmp_path):
    """A Ctrl-C that reached the workers too (same process group) loses them: no failure to cure, the run ends,
    preempted, with the lost worker as the cause."""
    cfg = small_recipe(tmp_path, *QUIET)
    log_dir = tmp_path / "logs" / "run"
    log_dir.mkdir(parents=True)

    class LosesItsEnvWorker(Runner):
        def train_step(self):
            raise _lost("env")

    with create_cluster(cfg.cluster) as cluster, pytest.raises(WorkersStopped, match="^stopped by SIGINT in step 1: "
                                                                                     "the workers got") as stopped:
        supervise(cluster, cfg, log_dir, lambda resume_dir, logger: LosesItsEnvWorker(
            cfg, log_dir, cluster, resume_dir=resume_dir, run_logger=logger), stop_requested=lambda: "SIGINT")
    assert isinstance(stopped.value.__cause__, WorkerLost) and "env worker rank 0" in str(stopped.value.__cause__)
    assert not (log_dir / "restarts.jsonl").exists()


def _killer(log_dir: Path, kills: list[tuple[int, str]], done: list[str]) -> None:
    """SIGKILL the process of each ``(step, role)``'s worker once global_step_<step> is complete (the next step is
    then under way); ``done`` gets the roles killed."""
    import ray

    for step, role in kills:
        while not any(p.name == f"global_step_{step}" for p in complete_checkpoints(log_dir / "checkpoints")):
            time.sleep(0.05)
        alive = [a for a in ray._private.state.actors().values()
                 if a["State"] == "ALIVE" and a["Name"].startswith(f"rlrunner-{role}-")]
        # the newest group's (names end in a spawn serial): one torn down a moment ago may not be marked dead yet
        victim = max(alive, key=lambda a: int(a["Name"].rsplit("-", 1)[1]))
        os.kill(victim["Pid"], signal.SIGKILL)
        done.append(role)


@pytest.mark.ray
@pytest.mark.slow
def test_sigkilled_actor_rollout_and_env_workers_cost_no_steps_and_change_no_bit(tmp_path):
    """One Ray run loses its actor, rollout and env worker processes in turn (SIGKILL, each after a checkpoint):
    it restarts three times and ends with the adapters of an uninterrupted run (in-process workers give the same
    bits as Ray's)."""
    import ray

    reference = tmp_path / "reference"
    reference.mkdir()
    run(small_recipe(tmp_path, *QUIET), reference)
    log_dir = tmp_path / "logs" / "killed"
    log_dir.mkdir(parents=True)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        killed: list[str] = []
        kills = [(1, "actor"), (2, "rollout"), (3, "env")]
        killer = threading.Thread(target=_killer, args=(log_dir, kills, killed), daemon=True)
        killer.start()
        run(small_recipe(tmp_path, *QUIET, "cluster.backend=ray", "cluster.num_devices_per_node=3",
                         "cluster.worker_timeout_s=120", "cluster.component_placement={actor: 0, rollout: 1, env: 2}"),
            log_dir)
        node_ip = ray.util.get_node_ip_address()
    finally:
        ray.shutdown()
    assert killed == ["actor", "rollout", "env"]
    ours, theirs = (torch.load(d / "checkpoints/global_step_4/actor.pt", weights_only=False)["adapters"]
                    for d in (log_dir, reference))
    for adapter in ("default", "ema"):
        for key, tensor in theirs[adapter].items():
            assert torch.equal(ours[adapter][key], tensor), f"{adapter} {key}"
    restarts = [json.loads(line) for line in (log_dir / "restarts.jsonl").read_text().splitlines()]
    assert [(r["number"], r["cause"], r["exception"], r["worker"].split(" on ")[0]) for r in restarts] == [
        (1, "worker_lost", "WorkerLost", "actor worker rank 0"), (2, "worker_lost", "WorkerLost", "rollout worker rank 0"),
        (3, "worker_lost", "WorkerLost", "env worker rank 0")]
    for restart in restarts:  # each killed in the step after its checkpoint: nothing finished was lost
        assert restart["step_failed_at"] == restart["step_resumed_from"] + 1 and restart["lost_steps"] == 0
        assert restart["node"] == node_ip and restart["seconds"] > 0
    assert [(m["step"], m["recovery/restarts"]) for m in read_metrics(log_dir) if "recovery/restarts" in m] == [
        (1, 1), (2, 2), (3, 3)]
    assert sorted({m["step"] for m in train_metrics(log_dir)}) == [1, 2, 3, 4]


def test_replayed_steps_reach_every_tracker_and_metrics_jsonl_keeps_one_line_per_step(tmp_path, monkeypatch):
    """A worker lost in step 4 (checkpoint at step 2): steps 3 and 4 run again after the restart. The trackers get a
    logging step that only grows (wandb drops a step it has passed) with the training step as ``global_step``;
    metrics.jsonl and TensorBoard keep one value per training step, the replayed one."""
    mlflow = pytest.importorskip("mlflow", reason="mlflow-skinny is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = small_recipe(tmp_path, *QUIET, "runner.save_interval=2", "runner.logger.logger_backends=[tensorboard,mlflow]")
    log_dir = tmp_path / "logs" / "run"
    log_dir.mkdir(parents=True)
    lost: list[int] = []

    class LosesAWorkerInStep4Once(Runner):
        def train_step(self):
            if self.step == 3 and not lost:
                lost.append(self.step)
                raise _lost("rollout")
            return super().train_step()

    with create_cluster(cfg.cluster) as cluster:
        supervise(cluster, cfg, log_dir, lambda resume_dir, logger: LosesAWorkerInStep4Once(
            cfg, log_dir, cluster, resume_dir=resume_dir, run_logger=logger))
    records = read_metrics(log_dir)
    assert [m["step"] for m in train_metrics(log_dir)] == [1, 2, 3, 4]
    assert [(m["step"], m["recovery/lost_steps"]) for m in records if "recovery/restarts" in m] == [(2, 1)]
    assert [m["step"] for m in records] == sorted(m["step"] for m in records)  # the lost step 3 left the file
    client = mlflow.tracking.MlflowClient(tracking_uri=f"file:{log_dir / 'mlruns'}")
    (tracked,) = client.search_runs([client.get_experiment_by_name("rlrunner").experiment_id])

    def history(key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in sorted(client.get_metric_history(tracked.info.run_id, key),
                                                  key=lambda m: m.timestamp)]

    # logging steps 1-3, then past them: the restart's metrics at 4, the replayed steps 3 and 4 at 5 and 6
    assert [step for step, _ in history("env/avg")] == [1, 2, 3, 5, 6]
    assert history("recovery/restarts") == [(4, 1.0)]
    assert sorted(history("global_step")) == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 2.0), (5, 3.0), (6, 4.0)]
    events = EventAccumulator(str(log_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("env/avg")] == [1, 2, 3, 4]
