"""Recipe node k -> Ray node, and the one-line errors when a placement asks for what the cluster lacks (no Ray)."""

from __future__ import annotations

import pytest

from rlrunner.cluster import PlacementError, parse_placement
from rlrunner.cluster.nodes import HEAD_RESOURCE, check_placement_fits, recipe_nodes

CLUSTER = "the Ray cluster at 10.0.0.1:6379"


def ray_node(node_id: str, ip: str, head: bool = False, alive: bool = True, **resources: float) -> dict:
    """One entry as ``ray.nodes()`` returns it."""
    return {"NodeID": node_id, "NodeManagerAddress": ip, "Alive": alive,
            "Resources": {**resources, **({HEAD_RESOURCE: 1.0} if head else {})}}


GPU_CLUSTER = [
    ray_node("ff01", "10.0.0.10", GPU=8, CPU=64),
    ray_node("aa00", "10.0.0.1", head=True, CPU=8),  # CPU-only head: not a GPU node
    ray_node("cc02", "10.0.0.9", GPU=8, CPU=64),
    ray_node("bb03", "10.0.0.9", GPU=4, CPU=32),  # same IP as cc02: ordered by node id
    ray_node("dd04", "10.0.0.2", alive=False, GPU=8, CPU=64),
]


def test_gpu_nodes_in_ip_then_node_id_order_skipping_a_cpu_head_and_dead_nodes():
    nodes = recipe_nodes(GPU_CLUSTER, "cuda")
    assert [(n.node_id, n.ip, n.devices) for n in nodes] == [
        ("bb03", "10.0.0.9", 4), ("cc02", "10.0.0.9", 8), ("ff01", "10.0.0.10", 8)]  # 10.0.0.9 < 10.0.0.10
    assert not any(n.is_head for n in nodes)


def test_cpu_devices_count_every_node_with_the_head_first():
    nodes = recipe_nodes(GPU_CLUSTER, "cpu")
    assert [n.node_id for n in nodes] == ["aa00", "bb03", "cc02", "ff01"]
    assert nodes[0].is_head and nodes[0].cpus == 8 and nodes[0].describe() == "10.0.0.1 (head, 8 CPUs)"
    assert nodes[1].describe() == "10.0.0.9 (ray node bb03, 32 CPUs)"
    assert recipe_nodes(GPU_CLUSTER, "cuda")[0].describe() == "10.0.0.9 (ray node bb03, 4 GPUs, 32 CPUs)"


def test_a_fitting_split_placement_passes():
    placement = parse_placement({"actor": "0-7", "rollout": "8-11", "env": "12"}, num_nodes=2, devices_per_node=8)
    nodes = recipe_nodes(GPU_CLUSTER, "cuda")[1:]  # cc02 (node 0), ff01 (node 1)
    check_placement_fits(placement, nodes, "cuda", 4.0, CLUSTER)


def one_line_error(placement, nodes, device_type: str, cpus_per_worker: float = 1.0) -> str:
    with pytest.raises(PlacementError) as info:
        check_placement_fits(placement, nodes, device_type, cpus_per_worker, CLUSTER)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_node_the_cluster_does_not_have_is_named_with_what_it_has():
    placement = parse_placement({"actor": "0-1", "rollout": 2, "env": 3}, num_nodes=4, devices_per_node=1)
    message = one_line_error(placement, recipe_nodes(GPU_CLUSTER[:2], "cpu"), "cpu")
    assert message == (
        "cluster.component_placement: rollout asks for device 2 (node 2, its device 0), but the Ray cluster at "
        "10.0.0.1:6379 has 2 nodes with CPU devices (node 0 = 10.0.0.1 (head, 8 CPUs), node 1 = 10.0.0.10 "
        "(ray node ff01, 64 CPUs)); fit cluster.num_nodes, cluster.num_devices_per_node and "
        "cluster.component_placement to it, or add nodes")


def test_a_gpu_beyond_a_smaller_node_is_named():
    placement = parse_placement({"actor,rollout": "0-7", "env": "8-15"}, num_nodes=2, devices_per_node=8)
    message = one_line_error(placement, recipe_nodes(GPU_CLUSTER, "cuda"), "cuda")  # node 0 = bb03, 4 GPUs
    assert message.startswith("cluster.component_placement: actor and rollout ask for device 4 (node 0, its device "
                              "4), but node 0 of the Ray cluster at 10.0.0.1:6379 is 10.0.0.9 (ray node bb03, 4 "
                              "GPUs, 32 CPUs); set cluster.num_devices_per_node to the smallest node's count")


def test_no_node_with_the_device_kind():
    placement = parse_placement({"actor,env,rollout": "all"}, num_nodes=1, devices_per_node=1)
    message = one_line_error(placement, recipe_nodes(GPU_CLUSTER, "npu"), "npu")
    assert ("actor, env and rollout ask for device 0 (node 0, its device 0), but the Ray cluster at 10.0.0.1:6379 "
            "has no alive node with NPUs") in message


def test_more_worker_cpus_than_a_node_has():
    placement = parse_placement({"actor,env,rollout": "all"}, num_nodes=1, devices_per_node=2)
    message = one_line_error(placement, recipe_nodes(GPU_CLUSTER[:2], "cpu"), "cpu", cpus_per_worker=2.0)
    assert message.startswith("cluster.component_placement puts 6 workers x cluster.cpus_per_worker=2 CPUs on "
                              "node 0 of the Ray cluster at 10.0.0.1:6379, 10.0.0.1 (head, 8 CPUs); lower")
