"""Which Ray node is recipe node ``k``, and whether the placement fits the connected cluster's nodes.

Pure data: reads the node dicts that ``ray.nodes()`` returns (no Ray import here). The rule that maps recipe
node indices onto Ray nodes:

* only alive nodes that have the placement's device kind count (nodes with GPUs for ``cuda``, with ``NPU``
  resources for ``npu``, every node for CPU "devices"), so a CPU-only head node is skipped on a GPU cluster;
* node 0 is the head node when it counts; the others follow in order of IP address (numerically), and nodes
  that share an IP (several raylets on one machine, as in ``ray.cluster_utils.Cluster``) in order of Ray
  node id.

Recipe device ``d`` then lives on recipe node ``d // devices_per_node``, as
:class:`~rlrunner.cluster.placement.Placement` counts them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlrunner.cluster.placement import Placement, PlacementError

# device kind -> Ray resource name that reserves one such device in a placement bundle
RAY_RESOURCE: dict[str, str] = {"cuda": "GPU", "npu": "NPU", "cpu": "CPU"}
HEAD_RESOURCE = "node:__internal_head__"  # a resource only the head node has
NODE_ID_LABEL = "ray.io/node-id"  # the label Ray gives every node: its node id
_LISTED_NODES = 4  # nodes named in an error message before "..."


@dataclass(frozen=True)
class RayNode:
    """One alive Ray node as the placement sees it.

    Attributes:
        node_id: Ray's hex node id (also the node's ``ray.io/node-id`` label).
        ip: the node's IP address.
        is_head: True for the cluster's head node.
        devices: accelerators of the placement's kind on the node (its ``resource``); 0 for CPU devices.
        cpus: logical CPUs of the node.
        resource: the Ray resource of the devices: ``"GPU"``, ``"NPU"``, or ``"CPU"`` for CPU devices.
    """

    node_id: str
    ip: str
    is_head: bool
    devices: int
    cpus: float
    resource: str = "CPU"

    def describe(self) -> str:
        """``"10.0.0.1 (head, 8 GPUs, 64 CPUs)"``; other nodes show the start of their Ray node id."""
        who = "head" if self.is_head else f"ray node {self.node_id[:8]}"
        parts = [who] + ([_count(self.devices, self.resource)] if self.resource != "CPU" else [])
        return f"{self.ip} ({', '.join(parts)}, {self.cpus:g} CPUs)"


def alive_nodes(ray_nodes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The entries of ``ray.nodes()`` whose node is alive."""
    return [n for n in ray_nodes if n.get("Alive", n.get("alive", False))]


def recipe_nodes(ray_nodes: Sequence[Mapping[str, Any]], device_type: str) -> list[RayNode]:
    """Ray nodes in recipe order (index ``k`` is recipe node ``k``), by the rule in the module docstring.

    Args:
        ray_nodes: what ``ray.nodes()`` returns (dead nodes are skipped).
        device_type: ``"cuda"``, ``"npu"`` or ``"cpu"``.
    """
    resource = RAY_RESOURCE[device_type]
    nodes = []
    for raw in alive_nodes(ray_nodes):
        resources = raw.get("Resources", {})
        devices = int(resources.get(resource, 0)) if device_type != "cpu" else 0
        if device_type != "cpu" and devices < 1:
            continue
        nodes.append(RayNode(node_id=raw["NodeID"], ip=raw.get("NodeManagerAddress", ""),
                             is_head=HEAD_RESOURCE in resources, devices=devices,
                             cpus=float(resources.get("CPU", 0.0)), resource=resource))
    return sorted(nodes, key=lambda n: (not n.is_head, _ip_order(n.ip), n.node_id))


def check_placement_fits(
    placement: Placement, nodes: Sequence[RayNode], device_type: str, cpus_per_worker: float, cluster_name: str
) -> None:
    """Fail with one line when a component asks for a device (or CPUs) the cluster's nodes do not have.

    Args:
        placement: the parsed ``cluster.component_placement``.
        nodes: :func:`recipe_nodes` of the connected cluster.
        device_type: the placement's device kind.
        cpus_per_worker: ``cluster.cpus_per_worker`` (each worker's CPUs in its device's bundle).
        cluster_name: how the message names the cluster, e.g. ``"the Ray cluster at 10.0.0.1:6379"``.

    Raises:
        PlacementError: naming the component, the device it asked for and what the cluster has.
    """
    for device in placement.used_devices:  # the lowest device that does not exist is the one named
        k, local = placement.node_of(device), placement.local_index(device)
        components = placement.components_on(device)
        names = " and ".join([", ".join(components[:-1]), components[-1]] if len(components) > 1 else components)
        asked = (f"cluster.component_placement: {names} ask{'s' * (len(components) == 1)} for device {device} "
                 f"(node {k}, its device {local})")
        if k >= len(nodes):
            raise PlacementError(
                f"{asked}, but {cluster_name} has {_listing(nodes, device_type)}; fit cluster.num_nodes, "
                "cluster.num_devices_per_node and cluster.component_placement to it, or add nodes"
            )
        if device_type != "cpu" and local >= nodes[k].devices:
            raise PlacementError(
                f"{asked}, but node {k} of {cluster_name} is {nodes[k].describe()}; set "
                "cluster.num_devices_per_node to the smallest node's count or fix cluster.component_placement"
            )
    for k, node in enumerate(nodes):
        workers = sum(len(placement.components_on(d)) for d in placement.used_devices if placement.node_of(d) == k)
        if workers * cpus_per_worker > node.cpus + 1e-6:
            raise PlacementError(
                f"cluster.component_placement puts {workers} workers x cluster.cpus_per_worker={cpus_per_worker:g} "
                f"CPUs on node {k} of {cluster_name}, {node.describe()}; lower cluster.cpus_per_worker "
                "or move components to other nodes"
            )


def _listing(nodes: Sequence[RayNode], device_type: str) -> str:
    kind = "CPU devices" if device_type == "cpu" else RAY_RESOURCE[device_type] + "s"
    if not nodes:
        return f"no alive node with {kind}"
    named = [f"node {k} = {n.describe()}" for k, n in enumerate(nodes[:_LISTED_NODES])]
    more = ", ..." if len(nodes) > _LISTED_NODES else ""
    return f"{_count(len(nodes), 'node')} with {kind} ({', '.join(named)}{more})"


def _ip_order(ip: str) -> tuple[int, int, str]:
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:  # a host name: after every numeric address, alphabetically
        return (99, 0, ip)
    return (address.version, int(address), "")


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"
