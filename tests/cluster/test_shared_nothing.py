"""A cluster that shares nothing but Ray, simulated on one machine: the second Ray node runs in its own mount
namespace (``unshare -m``, root) where an empty tmpfs hides the checkout's ``rlrunner/`` and the run's log root,
while the model folder stays visible (a shared model store). It is started with ``ray start --address ... --block``
from another folder without PYTHONPATH, and the recipe puts both actor ranks there.

The real entry point then: fails with one line naming that node and the fix when told the nodes have rlrunner
(``cluster.ship_code=false``) or given a model folder only the driver sees; with the code shipped, finishes, leaves complete checkpoints (``adapter/`` and
``adapter_ema/`` included) on the driver's disk, exports and resumes from them, and the node's own view of the
log root stays empty. The Ray processes started here are stopped by process group, never with ``ray stop``.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from runner_helpers import SMALL_OVERRIDES, make_assets, train_metrics
from test_ray_backend import _Alarm

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
STARTUP_TIMEOUT_S = 120
RUN_TIMEOUT_S = 300
# every process of this cluster, without token auth: a token file another Ray left in ~/.ray would otherwise turn
# it on for the head only, and the other processes would be refused
RAY_ENV = {"RAY_AUTH_MODE": "disabled"}
# the alive nodes' ids, the head's first, as a process that joins the cluster (argv[1]) sees them
LIST_NODES = """
import json, sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
nodes = [n for n in ray.nodes() if n["Alive"]]
head = [n["NodeID"] for n in nodes if "node:__internal_head__" in n["Resources"]]
print(json.dumps(head + [n["NodeID"] for n in nodes if n["NodeID"] not in head]))
"""
# 2 nodes x 2 CPU "devices": rollout and env on the head (recipe node 0), both actor ranks on the private node
SPLIT = ["cluster.backend=ray", "cluster.num_nodes=2", "cluster.num_devices_per_node=2",
         "cluster.component_placement={rollout: 0, env: 1, actor: 2-3}", "cluster.worker_timeout_s=60",
         "runner.save_interval=1", "runner.val_before_train=false", "runner.val_check_interval=0",
         "runner.sample_log_interval=0"]


def _free_block(size: int) -> int:
    """The first port of ``size`` consecutive ports that are free now (Ray's worker port ranges)."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - size)
        try:
            for port in range(base, base + size):
                with socket.socket() as sock:
                    sock.bind(("", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {size} consecutive free ports")


def _node_ports(base: int, head: bool) -> list[str]:
    """Every port a Ray node opens, explicit, so that this cluster cannot meet another one on the machine."""
    names = ["node-manager-port", "object-manager-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
             "runtime-env-agent-port", "metrics-export-port"]
    if head:
        names += ["port", "dashboard-port", "ray-client-server-port"]
    ports = [f"--{name}={base + i}" for i, name in enumerate(names)]
    return [*ports, f"--min-worker-port={base + 20}", f"--max-worker-port={base + 59}"]


def _ray_start(args: list[str], log: Path, *, private: tuple[Path, ...] = (), cwd: Path = ROOT) -> subprocess.Popen:
    """``ray start ... --block`` in its own process group; with ``private``, in a new mount namespace where each
    of those folders is an empty tmpfs, from ``cwd``, without PYTHONPATH."""
    command = shlex.join([RAY, "start", *args, "--num-cpus=2", "--disable-usage-stats", "--block"])
    if private:
        mounts = " && ".join(f"mount -t tmpfs none {shlex.quote(str(p))}" for p in private)
        command = f"mount --make-rprivate / && {mounts} && cd {shlex.quote(str(cwd))} && exec {command}"
        argv = ["unshare", "-m", "bash", "-c", command]
    else:
        argv = ["bash", "-c", f"exec {command}"]
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}, **RAY_ENV}
    with open(log, "w") as out:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    """End the ``ray start`` process and the daemons it started (its process group); its workers exit with their
    raylet. A short grace: nothing of this cluster needs a clean drain."""
    for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head node (recipe node 0) and the private node (recipe node 1); this process never joins them."""
    root = tmp_path_factory.mktemp("sharednothing")
    model, data = make_assets(root)
    (root / "logs").mkdir()
    (root / "elsewhere").mkdir()
    temp_dir = tempfile.mkdtemp(prefix="rlr-ns-", dir="/tmp")  # short: Ray's socket paths live under it
    head_base, node_base = _free_block(60), _free_block(60)
    address = f"127.0.0.1:{head_base + 6}"  # --port, the 7th of _node_ports
    procs = []
    try:
        with _Alarm(STARTUP_TIMEOUT_S):
            procs.append(_ray_start(["--head", *_node_ports(head_base, True), "--include-dashboard=false",
                                     f"--temp-dir={temp_dir}"], root / "head.log"))
            procs.append(_ray_start([f"--address={address}", *_node_ports(node_base, False), f"--temp-dir={temp_dir}"],
                                    root / "node.log", private=(ROOT / "rlrunner", root / "logs"),
                                    cwd=root / "elsewhere"))
            head_id, node_id = _wait_for_two_nodes(address, procs, root)
        paths = [f"actor.model.model_path={model}", f"env.train.dataset.path={data}", f"env.eval.dataset.path={data}",
                 f"runner.logger.log_path={root / 'logs'}", f"cluster.ray_address={address}"]
        yield SimpleNamespace(root=root, paths=paths, private=procs[1], head_id=head_id, node_id=node_id)
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_for_two_nodes(address: str, procs: list[subprocess.Popen], root: Path) -> tuple[str, str]:
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **RAY_ENV}
    while True:
        for proc, name in zip(procs, ("head", "node")):
            assert proc.poll() is None, f"ray start ({name}) ended:\n{(root / f'{name}.log').read_text()}"
        listed = subprocess.run([sys.executable, "-c", LIST_NODES, address], env=env, capture_output=True, text=True,
                                timeout=60, check=False)
        nodes = json.loads(listed.stdout.splitlines()[-1]) if listed.returncode == 0 else []
        if len(nodes) == 2:
            return nodes[0], nodes[1]
        time.sleep(1)


def _train(nodes: SimpleNamespace, name: str, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    log_dir = nodes.root / "logs" / name
    command = [sys.executable, "-m", "rlrunner.commands.train", "--config-name", "tiny_nft_ocr", "--log-dir", str(log_dir),
               *SMALL_OVERRIDES, *nodes.paths, *SPLIT, *overrides]
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **RAY_ENV, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          check=False)
    return proc, log_dir


def _private_view(nodes: SimpleNamespace, folder: Path) -> list[str]:
    """``ls -A folder`` as the private node sees it (inside its mount namespace)."""
    out = subprocess.run(["nsenter", "-t", str(nodes.private.pid), "-m", "ls", "-A", str(folder)], check=True,
                         capture_output=True, text=True, timeout=30)
    return out.stdout.split()


def test_a_node_without_rlrunner_fails_with_one_line_naming_it_and_the_fix(cluster):
    assert _private_view(cluster, ROOT / "rlrunner") == []  # the node really lacks the checkout
    proc, _ = _train(cluster, "20260101-000000-noship", "runner.max_steps=1", "cluster.ship_code=false")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr
    assert last.startswith("rlrunner: error: actor worker rank ") and f"ray node {cluster.node_id[:8]}" in last, last
    assert "on node 1 = " in last and "cannot import rlrunner" in last and "cluster.ship_code=true" in last, last


def test_a_model_folder_only_the_driver_sees_fails_with_one_line_naming_the_node_and_the_fix(cluster):
    hidden = shutil.copytree(cluster.root / "model", cluster.root / "logs" / "model-on-the-driver-only")
    try:
        proc, _ = _train(cluster, "20260101-000003-hidden", "runner.max_steps=1", f"actor.model.model_path={hidden}")
    finally:
        shutil.rmtree(hidden)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr
    assert last.startswith("rlrunner: error: actor worker rank ") and f"ray node {cluster.node_id[:8]}" in last, last
    assert f"cannot read actor.model.model_path={str(hidden)!r}" in last and "hub id" in last, last


def test_shipped_code_trains_there_and_only_the_driver_writes_files(cluster):
    proc, log_dir = _train(cluster, "20260101-000001-shipped", "runner.max_steps=2")
    assert proc.returncode == 0, proc.stderr
    placement = (log_dir / "placement.json").read_text()
    assert placement.count(cluster.node_id) == 2 and placement.count(cluster.head_id) == 2  # actor ranks: private node
    ckpt = log_dir / "checkpoints" / "global_step_2"
    for folder in ("adapter", "adapter_ema"):
        assert (ckpt / folder / "pytorch_lora_weights.safetensors").is_file(), folder
    assert not list((log_dir / "checkpoints").glob("*.tmp"))
    out = cluster.root / "exported"
    export = subprocess.run([sys.executable, "-m", "rlrunner.commands.export", str(ckpt), "--out", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, check=False)
    assert export.returncode == 0 and (out / "pytorch_lora_weights.safetensors").is_file(), export.stderr
    resumed, resumed_dir = _train(cluster, "20260101-000002-resumed", "runner.max_steps=3",
                                  f"runner.resume_dir={log_dir}")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {ckpt}" in resumed.stderr
    assert [m["step"] for m in train_metrics(resumed_dir)] == [3]
    assert (resumed_dir / "checkpoints" / "global_step_3" / "adapter_ema").is_dir()
    assert _private_view(cluster, cluster.root / "logs") == []  # nothing was written on the actor's node
