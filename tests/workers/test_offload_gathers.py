"""FSDP2 with ``cluster.enable_offload``: every gather of the actor's adapters and optimizer state runs with the
actor on its device, also when an eval (which hands the device to the rollout) comes right before a save.

The actor ranks are real Ray actors in a real gloo group; :mod:`offload_probe` makes "in host memory" visible on
CPU and fails a collective there, as NCCL would."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from offload_probe import LOG_DIR_ENV
from runner_helpers import small_recipe

from rlrunner.run.runner import run
from rlrunner.workers.actor import ActorWorker

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.ray
@pytest.mark.slow
def test_eval_then_save_gathers_on_the_device_with_fsdp2_and_offload(tmp_path):
    ray = pytest.importorskip("ray")
    probe_log = tmp_path / "collectives"
    probe_log.mkdir()
    paths = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "helpers"), os.environ.get("PYTHONPATH", "")])
    ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": "offload_probe.install",
                          "env_vars": {LOG_DIR_ENV: str(probe_log), "PYTHONPATH": paths}})
    try:
        log_dir = tmp_path / "logs" / "20260101-000000-offload"
        log_dir.mkdir(parents=True)
        # one step: rollout, update, sync, then the eval and the save of the last step, back to back
        run(small_recipe(tmp_path, "cluster.backend=ray", "cluster.num_devices_per_node=2",
                         "cluster.component_placement={'actor,env,rollout': all}", "actor.strategy=fsdp2",
                         "cluster.enable_offload=true", "runner.max_steps=1", "runner.val_check_interval=1",
                         "runner.val_before_train=false", "runner.save_interval=1", "runner.sample_log_interval=0",
                         "cluster.worker_timeout_s=300"), log_dir)
    finally:
        ray.shutdown()
    assert (log_dir / "checkpoints" / "global_step_1").is_dir()
    events = [[json.loads(line) for line in f.read_text().splitlines()] for f in probe_log.glob("*.jsonl")]
    actors = [e for e in events if any(x["event"] == "offload" for x in e)]
    assert len(actors) == 2  # both FSDP2 ranks
    for ranks_events in actors:
        names = [e["event"] if e["event"] != "collective" else e["op"] for e in ranks_events]
        assert all(e["devices"] == ["cpu"] for e in ranks_events if e["event"] == "collective")  # never "host"
        # the eval offloads the actor; the save then gathers adapters and optimizer state, after an onload
        eval_offload = len(names) - 1 - names[::-1].index("offload")
        after = names[eval_offload + 1:]
        assert after[0] == "onload" and after.count("redistribute") >= 4, names
        assert "all_gather_single" in names[:eval_offload]  # FSDP2's own gathers in the update were seen too


def test_a_gathering_call_on_an_offloaded_actor_brings_it_back_for_that_call_only(tmp_path, monkeypatch):
    """Whoever calls (not only the runner, which hands the device back first): an offloaded actor gathers on its
    device and returns to host memory after."""
    cfg = small_recipe(tmp_path)
    actor = ActorWorker(cfg.actor, cfg.algorithm, num_train_steps=1)
    moves = []  # offload_transformer(offload) calls: True = to host memory, False = back to the device
    monkeypatch.setattr(type(actor.model), "offload_transformer", lambda model, offload: moves.append(offload))
    actor.offload()
    for method in ("lora_weights", "state_dict"):
        moves.clear()
        assert getattr(actor, method)() is not None
        assert moves == [False, True] and actor.offloaded, method
    actor.onload()
    moves.clear()
    assert actor.lora_weights() is not None  # (the actor writes no files: the driver writes the adapters' files)
    assert moves == [] and not actor.offloaded  # on the device already: nothing moves
