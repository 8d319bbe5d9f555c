"""cluster.env_threads=node in a real local Ray: an env worker's torch, OpenMP and OCR threads are its node's CPUs
less the other workers' reservations, not its own one reserved CPU. Its own Ray session (the placement differs
from test_ray_backend's module cluster); every wait has a timeout."""

from __future__ import annotations

from types import SimpleNamespace

import cluster_toys
import pytest
import ray
from cluster_toys import ThreadReport
from test_ray_backend import STARTUP_TIMEOUT_S, TEST_TIMEOUT_S, _Alarm

from rlrunner.cluster import create_cluster

pytestmark = pytest.mark.ray


def test_an_env_worker_with_node_threads_gets_what_the_other_workers_leave():
    assert not ray.is_initialized(), "another test left Ray running"
    ray.cloudpickle.register_pickle_by_value(cluster_toys)  # the toys are not importable on Ray workers
    cfg = SimpleNamespace(num_nodes=1, num_devices_per_node=2, component_placement={"actor,rollout": "0", "env": "1"},
                          backend="ray", ray_address="", cpus_per_worker=1.0, env_threads="node",
                          worker_timeout_s=30.0, enable_offload=False)
    with _Alarm(STARTUP_TIMEOUT_S):
        cluster = create_cluster(cfg)
    try:
        with _Alarm(TEST_TIMEOUT_S):
            group = cluster.spawn("env", ThreadReport, (1,))
            report = group.call("report")[0]
            group.shutdown()
        # the Ray it started has at least 4 CPUs (3 reserved + 1): the env worker gets all but actor's and rollout's
        threads = int(cluster.nodes[0].cpus) - 2
        assert threads >= 2  # more than its one reserved CPU, which cluster.env_threads=reserved would give
        assert (report["torch"], report["omp"], report["ocr_engines"]) == (
            threads, str(threads), {"train": threads, "eval": threads})
    finally:
        with _Alarm(STARTUP_TIMEOUT_S):
            cluster.shutdown()
