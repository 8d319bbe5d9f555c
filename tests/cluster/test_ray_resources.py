"""Ray resource sizing from a placement, without starting Ray: bundles and fractional accelerator shares."""

from __future__ import annotations

import pytest

from rlrunner.cluster import parse_placement
from rlrunner.cluster.ray_backend import bundle_resources, worker_resources

ALL = parse_placement({"actor,env,rollout": "all"}, num_nodes=1, devices_per_node=2)
SPLIT = parse_placement({"actor,rollout": "0-1", "env": "2"}, num_nodes=1, devices_per_node=4)


def test_collocated_gpu_workers_share_one_gpu_bundle():
    assert bundle_resources(ALL, 0, "cuda", 1.0) == {"CPU": 3.0, "GPU": 1.0}
    assert worker_resources(ALL, 0, "cuda", 1.0) == {"num_cpus": 1.0, "num_gpus": 0.3333}
    assert 3 * worker_resources(ALL, 1, "cuda", 1.0)["num_gpus"] <= 1.0


def test_split_placement_gives_whole_and_half_devices():
    assert bundle_resources(SPLIT, 2, "cuda", 2.0) == {"CPU": 2.0, "GPU": 1.0}
    assert worker_resources(SPLIT, 2, "cuda", 2.0)["num_gpus"] == 1.0
    assert worker_resources(SPLIT, 0, "cuda", 2.0)["num_gpus"] == 0.5


def test_npu_is_a_custom_resource():
    assert bundle_resources(SPLIT, 0, "npu", 1.0) == {"CPU": 2.0, "NPU": 1.0}
    assert worker_resources(SPLIT, 0, "npu", 1.0) == {"num_cpus": 1.0, "resources": {"NPU": 0.5}}


def test_cpu_bundles_and_zero_cpus():
    assert bundle_resources(ALL, 1, "cpu", 0.5) == {"CPU": 1.5}
    assert worker_resources(ALL, 1, "cpu", 0.5) == {"num_cpus": 0.5}
    assert bundle_resources(ALL, 0, "cuda", 0.0) == {"GPU": 1.0}  # a zero entry is dropped, Ray rejects it
    with pytest.raises(ValueError, match="cpus_per_worker must be > 0 when workers run on CPUs only"):
        bundle_resources(ALL, 0, "cpu", 0.0)
