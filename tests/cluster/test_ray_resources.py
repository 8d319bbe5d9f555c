"""Ray resource sizing from a placement, without starting Ray: bundles, fractional accelerator shares and each
worker's CPU threads."""

from __future__ import annotations

import pytest

from rlrunner.cluster import parse_placement
from rlrunner.cluster.ray_backend import bundle_resources, worker_resources
from rlrunner.cluster.resources import worker_threads
from rlrunner.utils.threads import node_share_threads

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


# ------------------------------------------------------------------------------ CPU threads per worker
EIGHT_GPUS = parse_placement({"actor,env,rollout": "all"}, num_nodes=1, devices_per_node=8)


def test_node_threads_share_what_the_other_workers_leave():
    # 128 CPUs, 8 env + 16 actor/rollout workers of 1 CPU: (128 - 16) / 8 = 14 threads per env worker
    assert node_share_threads(128, env_workers=8, other_workers=16, cpus_per_worker=1.0) == 14
    assert node_share_threads(10, env_workers=3, other_workers=4, cpus_per_worker=1.0) == 2  # floor of 6 / 3
    # never below the env worker's own reservation, nor below 1 on a node the others fill
    assert node_share_threads(8, env_workers=2, other_workers=4, cpus_per_worker=3.0) == 3
    assert node_share_threads(4, env_workers=2, other_workers=8, cpus_per_worker=0.5) == 1


def test_env_workers_get_their_nodes_share_and_the_others_their_reservation():
    env = EIGHT_GPUS.devices_of("env")
    assert worker_threads(EIGHT_GPUS, [128.0], "env", env, 1.0, "node") == [14.0] * 8
    assert worker_threads(EIGHT_GPUS, [128.0], "actor", env, 1.0, "node") == [1.0] * 8
    assert worker_threads(EIGHT_GPUS, [128.0], "env", env, 1.0, "reserved") == [1.0] * 8  # the default: as before


def test_node_threads_follow_each_nodes_size_and_placement():
    # node 0: actor + rollout on 0-3 (8 other workers), env on 4-7 (4 env workers); node 1: env on 8 alone
    split = parse_placement({"actor,rollout": "0-3", "env": "4-8"}, num_nodes=2, devices_per_node=8)
    env = split.devices_of("env")
    assert worker_threads(split, [64.0, 32.0], "env", env, 2.0, "node") == [(64 - 8 * 2) // 4] * 4 + [32.0]
    assert worker_threads(split, [64.0, 32.0], "rollout", split.devices_of("rollout"), 2.0, "node") == [2.0] * 4
