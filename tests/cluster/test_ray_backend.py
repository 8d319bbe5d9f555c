"""The Ray backend, in one Ray session: DP all-reduce over gloo, calls, errors, a killed worker, shutdown.

The cluster starts its own local Ray (2 CPU bundles of 3 logical CPUs each: actor, env and rollout
collocated on 2 CPU "devices") once for the whole module; every wait has a timeout.
"""

from __future__ import annotations

import signal
import socket
import time
from operator import itemgetter
from types import SimpleNamespace

import cluster_toys
import pytest
import ray
from cluster_toys import BrokenInit, Counter, DataParallel, PortCheckedBeforeJoining, ThreadReport

from rlrunner.cluster import WorkerError, WorkerLocation, create_cluster
from rlrunner.cluster.ray_backend import RayCluster
from rlrunner.cluster.ray_teardown import gcs_reachable

pytestmark = pytest.mark.ray

TEST_TIMEOUT_S = 60
STARTUP_TIMEOUT_S = 120


class _Alarm:
    """Raise TimeoutError in the main thread after ``seconds`` (pytest-timeout is not installed)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds

    def _fire(self, signum, frame):
        raise TimeoutError(f"cluster test exceeded {self.seconds} s")

    def __enter__(self):
        self._old = signal.signal(signal.SIGALRM, self._fire)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self._old)


@pytest.fixture(autouse=True)
def _timeout():
    with _Alarm(TEST_TIMEOUT_S):
        yield


@pytest.fixture(scope="module")
def cluster():
    """One local Ray session for the module, started (and shut down) by the cluster itself."""
    assert not ray.is_initialized(), "another test left Ray running"
    ray.cloudpickle.register_pickle_by_value(cluster_toys)  # the toys are not importable on Ray workers
    cfg = SimpleNamespace(
        num_nodes=1,
        num_devices_per_node=2,
        component_placement={"actor,env,rollout": "all"},
        backend="ray",
        ray_address="",
        cpus_per_worker=1.0,
        worker_timeout_s=30.0,
        enable_offload=False,
    )
    with _Alarm(STARTUP_TIMEOUT_S):
        c = create_cluster(cfg)
    try:
        yield c
    finally:
        with _Alarm(STARTUP_TIMEOUT_S):
            c.shutdown()


@pytest.fixture(scope="module")
def counters(cluster):
    with _Alarm(STARTUP_TIMEOUT_S):
        return cluster.spawn("rollout", Counter, (0, 1), 5, scale=2)


def test_cluster_started_ray_with_one_bundle_per_device(cluster):
    assert isinstance(cluster, RayCluster) and cluster.device_type == "cpu"
    assert ray.cluster_resources()["CPU"] >= 7  # 2 bundles x 3 CPUs, +1 left for plain tasks
    bundles = ray.util.placement_group_table(cluster._pg)["bundles"]
    assert list(bundles.values()) == [{"CPU": 3.0}, {"CPU": 3.0}]


def test_bundles_are_pinned_to_the_node_and_workers_report_where_they_run(cluster, counters):
    node_id = ray.get_runtime_context().get_node_id()  # the one node of the Ray this cluster started
    assert [n.node_id for n in cluster.nodes] == [node_id] and cluster.nodes[0].is_head
    assert set(ray.util.placement_group_table(cluster._pg)["bundles_to_node_id"].values()) == {node_id}
    ip = ray.util.get_node_ip_address()
    assert counters.locations() == (WorkerLocation("rollout", 0, node_id, ip, "cpu"),
                                    WorkerLocation("rollout", 1, node_id, ip, "cpu"))
    alive = [a for a in ray._private.state.actors().values() if a["State"] == "ALIVE"]  # Ray's GCS actor table
    assert sorted(a["Name"].rsplit("-", 1)[0] for a in alive) == ["rlrunner-rollout-0", "rlrunner-rollout-1"]
    assert {a["Address"]["NodeID"] for a in alive} == {node_id}


def test_data_parallel_group_averages_with_gloo(cluster):
    group = cluster.spawn("actor", DataParallel, (0, 1))
    assert group.call("average") == [[1.5, 1.5, 1.5], [1.5, 1.5, 1.5]]  # mean of rank+1 over 2 ranks
    env = group.call("env")
    assert [e["RANK"] for e in env] == ["0", "1"] and {e["WORLD_SIZE"] for e in env} == {"2"}
    assert [e["LOCAL_RANK"] for e in env] == ["0", "1"]  # both ranks on this one node
    assert env[0]["MASTER_ADDR"] == env[1]["MASTER_ADDR"] == group.node_ips[0]
    assert env[0]["MASTER_PORT"] == env[1]["MASTER_PORT"] != ""
    assert {e["RLRUNNER_DIST_TIMEOUT_S"] for e in env} == {"30.0"}  # cluster.worker_timeout_s, not a fixed 600 s
    # the rendezvous store listens on the node's IP only (a TCPStore given a host still listens on every interface)
    port = int(env[0]["MASTER_PORT"])
    with socket.create_connection((group.node_ips[0], port), timeout=5):
        pass
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2" if group.node_ips[0] != "127.0.0.2" else "127.0.0.3", port), timeout=5)


def test_a_group_that_forms_no_process_group_binds_no_rendezvous_store(counters):
    assert counters.call("rendezvous_env") == [{}, {}]  # rollout-like workers: no store, no MASTER_* variables


def test_rank_0_holds_the_rendezvous_port_from_its_start_until_the_group_forms(cluster):
    # the port is bound before any constructor runs: neither rank (nor the driver) can take it while models load
    group = cluster.spawn("actor", PortCheckedBeforeJoining, (0, 1))
    try:
        assert group.call("port_free_before_join") == [False, False]
        port = int(group.call("env")[0]["MASTER_PORT"])
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock, pytest.raises(OSError):
            sock.bind(("", port))
        assert group.call("average") == [[1.5, 1.5, 1.5], [1.5, 1.5, 1.5]]  # and the group formed over it
    finally:
        group.shutdown()


def test_an_env_worker_sizes_its_threads_to_its_cpu_reservation_not_the_node(cluster):
    # cluster.cpus_per_worker=1 on a bundle of 3 CPUs: torch, OpenMP and the OCR engines get 1 thread, not every core
    group = cluster.spawn("env", ThreadReport, (0,))
    try:
        report = group.call("report")[0]
        assert report["cores_visible"] >= 2  # Ray does not narrow the affinity mask: the old sizing would use them
        assert (report["torch"], report["omp"], report["ocr_engines"]) == (1, "1", {"train": 1, "eval": 1})
    finally:
        group.shutdown()


def test_call_async_scatter_and_call_rank(counters):
    assert counters.call("identity") == [(0, 2), (1, 2)]
    assert counters.call("value") == [10, 11]
    slow = counters.call_async("sleep", 0.3)
    assert not slow.done()  # the driver is free while the workers run
    assert slow.get() == [0.3, 0.3] and slow.done()
    assert counters.scatter("add", [(1,), (2,)]) == [11, 13]
    assert counters.scatter_async("add", [(), ()], [{"x": 1}, {"x": 2}]).get() == [12, 15]
    assert counters.call_rank(1, "value") == 15


def test_method_exception_carries_the_remote_traceback(counters):
    with pytest.raises(WorkerError) as info:
        counters.call("fail_on_rank", 1)
    err = info.value
    assert (err.role, err.rank, err.node_ip) == ("rollout", 1, counters.node_ips[1])
    message = str(err)
    assert message.startswith(f"rollout worker rank 1 on {err.node_ip} raised in 'fail_on_rank': RuntimeError: boom")
    assert "cluster_toys.py" in message and "\x1b[" not in message
    assert counters.call("value") == [12, 15]  # the workers live on


def test_slow_call_times_out_with_a_worker_error(counters):
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"did not finish 'sleep' within 0.5 s .* ranks still running: \[0, 1\]"):
        counters.call_async("sleep", 2.0).get(timeout_s=0.5)
    assert time.monotonic() - start < 5


def test_result_parts_stay_with_the_workers_and_reach_other_calls_by_reference(counters):
    pending = counters.scatter_async("tensors", [(1000,), (1000,)],
                                     per_rank_parts=[(itemgetter("large"), itemgetter("small"))] * 2)
    assert [int(t) for t in pending.part(1).get()] == [0, 1]  # the driver fetches the small parts only
    large = pending.part(0).handles()
    assert all(isinstance(h, ray.ObjectRef) for h in large)
    # rank 0 receives both ranks' large parts (1000 x 1.0 and 1000 x 2.0), rank 1 its own; nested in a list
    assert counters.scatter("sum_of", [(large,), ([large[1]],)]) == [3000.0, 2000.0]
    assert [part[1].item() for part in pending.get()] == [0, 1]  # get() gives each rank's tuple of parts
    with pytest.raises(ValueError, match=r"per_rank_parts must give every rank the same number \(>= 2\)"):
        counters.scatter_async("tensors", [(1,), (1,)], per_rank_parts=[(itemgetter("large"),)] * 2)


def test_constructor_exception_frees_its_slot(cluster):
    with pytest.raises(WorkerError, match=r"env worker rank 0 on \S+ raised in 'BrokenInit.__init__': OSError"):
        cluster.spawn("env", BrokenInit, (0,))
    assert cluster._slots_used == {0: 2, 1: 2}  # actor + rollout; the failed env worker gave its slot back


def test_killed_worker_is_reported_within_bounded_time(cluster, counters):
    cluster.spawn("env", Counter, (0,))  # the third and last worker device 0 has room for
    with pytest.raises(ValueError, match=r"device 0 already holds 3 worker\(s\), .* \(actor, env, rollout\)"):
        cluster.spawn("extra", Counter, (0,))
    start = time.monotonic()
    with pytest.raises(WorkerError) as info:
        counters.call("exit_on_rank", 1)
    assert time.monotonic() - start < 20
    assert str(info.value).startswith(f"rollout worker rank 1 on {counters.node_ips[1]} died during 'exit_on_rank'")
    with pytest.raises(WorkerError, match="rank 1 .* died"):
        counters.call("value")  # the dead worker stays dead, reported at once
    counters.shutdown()
    assert counters not in cluster.groups


def test_the_gcs_of_the_ray_it_started_is_reachable(cluster):
    assert gcs_reachable()  # so teardown gives the placement group back and kills the actors


def test_shutdown_kills_workers_and_stops_the_ray_it_started(cluster):
    assert len(cluster.groups) == 2  # actor, env
    cluster.shutdown()
    assert cluster.groups == () and not ray.is_initialized()
