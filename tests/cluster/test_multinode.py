"""A real 2-node Ray cluster on this machine (``ray.cluster_utils.Cluster``), joined by the real entry point.

The tiny recipe runs with its actor ranks on node 0 and rollout and env on node 1; the test checks from Ray's
own GCS actor table and from ``placement.json`` that every worker ran where the recipe says, kills one worker
process mid-run (SIGKILL), checks the one-line report and that ``runner.resume_dir=auto`` finishes the run, and
that a device the cluster does not have is refused before any model loads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray
from ray.cluster_utils import Cluster
from runner_helpers import SMALL_OVERRIDES, make_assets, train_metrics
from test_ray_backend import _Alarm

from rlrunner.recipe import load_recipe
from rlrunner.run.checkpoint import complete_checkpoints

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 120
RUN_TIMEOUT_S = 420
WORKER_TIMEOUT_S = 60
# recipe: 2 nodes x 2 CPU "devices"; actor ranks on node 0 (devices 0-1), rollout and env on node 1
SPLIT = ["cluster.backend=ray", "cluster.num_nodes=2", "cluster.num_devices_per_node=2",
         "cluster.component_placement={actor: 0-1, rollout: 2, env: 3}",
         f"cluster.worker_timeout_s={WORKER_TIMEOUT_S}",
         "runner.max_steps=3", "runner.save_interval=1", "runner.val_before_train=false",
         "runner.val_check_interval=0", "runner.sample_log_interval=0"]
RECIPE_NODE = {"actor": 0, "rollout": 1, "env": 1}


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Head (recipe node 0) and one worker node (recipe node 1), 2 CPUs each; this process joins to read
    Ray's tables. Everything is shut down at the end."""
    assert not ray.is_initialized(), "another test left Ray running"
    with _Alarm(STARTUP_TIMEOUT_S):
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
        try:
            worker = cluster.add_node(num_cpus=2)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address)
        except BaseException:
            cluster.shutdown()
            raise
    root = tmp_path_factory.mktemp("multinode")
    model, data = make_assets(root)
    paths = [f"actor.model.model_path={model}", f"env.train.dataset.path={data}", f"env.eval.dataset.path={data}",
             f"runner.logger.log_path={root / 'logs'}"]
    try:
        yield SimpleNamespace(address=cluster.address, root=root, paths=paths, cluster=cluster, worker=worker,
                              node_ids=[cluster.head_node.node_id, worker.node_id])
    finally:
        with _Alarm(STARTUP_TIMEOUT_S):
            ray.shutdown()
            cluster.shutdown()


@contextmanager
def training(nodes: SimpleNamespace, name: str, *overrides: str) -> Iterator[tuple[subprocess.Popen, Path, Path]]:
    """``python -m rlrunner.commands.train`` joining the cluster by ``cluster.ray_address``: the process, its log dir and
    the file its stderr goes to (a file, not a pipe, so a chatty run never blocks). The process is killed on
    leaving the block if it still runs (a failed assertion, a timeout)."""
    log_dir = nodes.root / "logs" / name
    command = [sys.executable, "-m", "rlrunner.commands.train", "--config-name", "tiny_nft_ocr", "--log-dir", str(log_dir),
               *SMALL_OVERRIDES, *nodes.paths, f"cluster.ray_address={nodes.address}", *overrides]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)
    stderr = nodes.root / f"{name}.stderr"
    with open(nodes.root / f"{name}.stdout", "w") as out, open(stderr, "w") as err:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err)
    try:
        yield proc, log_dir, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def rlrunner_actors(known: set[str] = frozenset()) -> dict[str, dict]:
    """Ray's GCS actor table entries of rlrunner workers not in ``known``, by actor id."""
    return {aid: a for aid, a in ray._private.state.actors().items()
            if a["Name"].startswith("rlrunner-") and aid not in known}


@pytest.fixture(scope="module")
def killed_run(two_nodes):
    """The split recipe, SIGKILLed in one actor rank's process once global_step_1 is saved; without restarts (as
    before runner.max_restarts), so the run stops."""
    before = set(rlrunner_actors())
    run = training(two_nodes, "20260101-000000-multinode", *SPLIT, "runner.max_restarts=0")
    with _Alarm(RUN_TIMEOUT_S), run as (proc, log_dir, stderr):
        while not complete_checkpoints(log_dir / "checkpoints"):
            assert proc.poll() is None, f"the run ended before its first checkpoint:\n{stderr.read_text()}"
            time.sleep(0.1)
        alive = {aid: a for aid, a in rlrunner_actors(before).items() if a["State"] == "ALIVE"}
        (victim,) = [a for a in alive.values() if a["Name"].startswith("rlrunner-actor-1-")]
        os.kill(victim["Pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(timeout=WORKER_TIMEOUT_S + 30)
        stopped_after = time.monotonic() - killed_at
    return SimpleNamespace(log_dir=log_dir, actors=alive, returncode=proc.returncode, stderr=stderr.read_text(),
                           stopped_after=stopped_after)


def test_every_worker_runs_on_the_node_and_device_the_recipe_names(two_nodes, killed_run):
    names = sorted(a["Name"].rsplit("-", 1)[0] for a in killed_run.actors.values())
    assert names == ["rlrunner-actor-0", "rlrunner-actor-1", "rlrunner-env-0", "rlrunner-rollout-0"]
    for actor in killed_run.actors.values():  # Ray's own record of where each actor process lives
        component = actor["Name"].split("-")[1]
        assert actor["Address"]["NodeID"] == two_nodes.node_ids[RECIPE_NODE[component]], actor["Name"]
    report = json.loads((killed_run.log_dir / "placement.json").read_text())
    ip = ray.util.get_node_ip_address()
    assert [(e["component"], e["rank"]) for e in report] == [("actor", 0), ("actor", 1), ("rollout", 0), ("env", 0)]
    for entry in report:
        assert entry["node_id"] == two_nodes.node_ids[RECIPE_NODE[entry["component"]]], entry
        assert entry["node_ip"] == ip and entry["device"] == "cpu"
    assert "placement (" in killed_run.stderr and "  actor      1     " in killed_run.stderr


def test_a_killed_worker_stops_the_run_with_one_line_naming_it(killed_run):
    last = killed_run.stderr.strip().splitlines()[-1]
    assert killed_run.returncode == 1, killed_run.stderr
    assert last.startswith("rlrunner: error: actor worker rank 1 on "), killed_run.stderr
    assert " died during " in last and "runner.resume_dir=auto" in last
    assert "Traceback (most recent call last)" not in killed_run.stderr  # none from the driver
    assert killed_run.stopped_after < WORKER_TIMEOUT_S


def test_resume_auto_finishes_the_killed_run_from_its_last_complete_checkpoint(two_nodes, killed_run):
    saved = [int(p.name.rsplit("_", 1)[1]) for p in complete_checkpoints(killed_run.log_dir / "checkpoints")]
    assert saved and saved[-1] < 3
    resumed = training(two_nodes, "20260101-000001-multinode", *SPLIT, "runner.resume_dir=auto")
    with _Alarm(RUN_TIMEOUT_S), resumed as (proc, log_dir, stderr_file):
        proc.wait(timeout=RUN_TIMEOUT_S - 10)
    stderr = stderr_file.read_text()
    assert proc.returncode == 0, stderr
    assert f"resumed from {killed_run.log_dir / 'checkpoints' / f'global_step_{saved[-1]}'}" in stderr
    assert [m["step"] for m in train_metrics(log_dir)] == list(range(saved[-1] + 1, 4))
    assert (log_dir / "checkpoints" / "global_step_3").is_dir()


def test_a_device_the_cluster_lacks_fails_before_any_model_loads(two_nodes):
    before = set(rlrunner_actors())
    too_large = training(two_nodes, "20260101-000002-toolarge", "cluster.backend=ray", "cluster.num_nodes=3",
                         "cluster.component_placement={actor: 0, rollout: 1, env: 2}")
    with _Alarm(STARTUP_TIMEOUT_S), too_large as (proc, _, stderr_file):
        proc.wait(timeout=STARTUP_TIMEOUT_S - 10)
    stderr = stderr_file.read_text()
    assert proc.returncode == 2, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith(
        f"rlrunner: error: cluster.component_placement: env asks for device 2 (node 2, its device 0), but the Ray "
        f"cluster at {two_nodes.address} has 2 nodes with CPU devices (node 0 = ")
    assert not rlrunner_actors(before)  # no worker was started, so no model was loaded


def test_a_lost_node_costs_a_restart_and_no_bit_of_the_adapters(two_nodes):
    """Recipe node 1 (rollout and env) goes away once global_step_1 is saved and a new node takes its place: the run
    waits for it (cluster.rejoin_timeout_s), restarts there and ends with the adapters of an uninterrupted run.
    Runs last: it replaces the module's worker node."""
    import torch

    from rlrunner.run.runner import run

    one_actor = [*[o for o in SPLIT if not o.startswith(("cluster.component_placement", "runner.max_steps"))],
                 "cluster.component_placement={actor: 0, rollout: 2, env: 3}", "runner.max_steps=2"]
    reference = two_nodes.root / "logs" / "20260101-000003-reference"
    reference.mkdir(parents=True)
    in_process = [o for o in one_actor if not o.startswith("cluster.")]
    run(load_recipe("tiny_nft_ocr", [*SMALL_OVERRIDES, *two_nodes.paths, *in_process]), reference)
    lost = training(two_nodes, "20260101-000004-lostnode", *one_actor, "cluster.rejoin_timeout_s=120")
    with _Alarm(RUN_TIMEOUT_S), lost as (proc, log_dir, stderr_file):
        while not complete_checkpoints(log_dir / "checkpoints"):
            assert proc.poll() is None, f"the run ended before its first checkpoint:\n{stderr_file.read_text()}"
            time.sleep(0.05)
        two_nodes.cluster.remove_node(two_nodes.worker)
        time.sleep(2.0)  # the run notices, tears down and waits for a node 1
        two_nodes.worker = two_nodes.cluster.add_node(num_cpus=2)
        proc.wait(timeout=RUN_TIMEOUT_S - 30)
    stderr = stderr_file.read_text()
    assert proc.returncode == 0, stderr
    (restart,) = [json.loads(line) for line in (log_dir / "restarts.jsonl").read_text().splitlines()]
    assert restart["cause"] == "worker_lost" and restart["step_resumed_from"] == 1, restart
    assert restart["worker"].startswith(("rollout worker rank 0", "env worker rank 0")), restart
    assert "rlrunner: restart 1/3: " in stderr
    report = {e["component"]: e["node_id"] for e in json.loads((log_dir / "placement.json").read_text())}
    assert report["rollout"] == report["env"] == two_nodes.worker.node_id  # the new node is recipe node 1
    ours, theirs = (torch.load(d / "checkpoints/global_step_2/actor.pt", weights_only=False)["adapters"]
                    for d in (log_dir, reference))
    for adapter in ("default", "ema"):
        for key, tensor in theirs[adapter].items():
            assert torch.equal(ours[adapter][key], tensor), f"{adapter} {key}"
