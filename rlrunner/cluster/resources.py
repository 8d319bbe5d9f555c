"""What accelerators the cluster has (device kind, devices per node), what each worker reserves of them, and the
CPU threads each worker runs (:func:`worker_threads`).

Asks a connected Ray cluster first (its nodes may differ from the driver's machine), then torch on this
machine, and falls back to one CPU "device" per node. Ray is consulted only when this process has already
connected to it; nothing here starts Ray.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch

from rlrunner.cluster.nodes import RAY_RESOURCE, alive_nodes
from rlrunner.cluster.placement import Placement
from rlrunner.utils.device import npu_available
from rlrunner.utils.threads import node_share_threads


def detect_device_type() -> str:
    """``"cuda"``, ``"npu"`` or ``"cpu"``: the accelerator kind workers will run on."""
    per_node = _ray_devices_per_node()
    if per_node is not None:
        return per_node[0]
    if torch.cuda.is_available():
        return "cuda"
    return "npu" if npu_available() else "cpu"


def detect_devices_per_node(cluster_cfg: Any) -> int:
    """Devices per node for ``cluster_cfg`` (a ClusterConfig or anything with ``num_devices_per_node``).

    ``num_devices_per_node`` when > 0; else, when this process is connected to Ray, the GPUs (or "NPU"
    resources) of the cluster's largest node, or 1 without accelerators; else ``torch.cuda.device_count()``
    or the torch-npu device count of this machine; else 1 (one CPU "device").
    """
    configured = int(getattr(cluster_cfg, "num_devices_per_node", 0) or 0)
    if configured > 0:
        return configured
    if configured < 0:
        raise ValueError(f"cluster.num_devices_per_node must be >= 0 (0 = detect), got {configured}")
    per_node = _ray_devices_per_node()
    if per_node is not None:
        return per_node[1]
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    if npu_available():
        return torch.npu.device_count()
    return 1


def _ray_devices_per_node() -> tuple[str, int] | None:
    """``(kind, count)`` of the largest alive node of a connected Ray cluster (``("cpu", 1)`` without
    accelerators); None when this process is not connected to Ray."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    nodes = alive_nodes(ray.nodes())
    for kind in ("cuda", "npu"):
        counts = [int(n.get("Resources", {}).get(RAY_RESOURCE[kind], 0)) for n in nodes]
        if max(counts, default=0) > 0:
            return kind, max(counts)
    return "cpu", 1


def bundle_resources(placement: Placement, device: int, device_type: str, cpus_per_worker: float) -> dict[str, float]:
    """Placement-group bundle of ``device``: one accelerator plus ``cpus_per_worker`` per component on it."""
    bundle = {"CPU": cpus_per_worker * len(placement.components_on(device))}
    if device_type != "cpu":
        bundle[RAY_RESOURCE[device_type]] = 1.0
    elif cpus_per_worker <= 0:
        raise ValueError("cluster.cpus_per_worker must be > 0 when workers run on CPUs only")
    return {k: v for k, v in bundle.items() if v > 0}


def worker_resources(placement: Placement, device: int, device_type: str, cpus_per_worker: float) -> dict[str, Any]:
    """Ray actor options of one worker on ``device``: its CPUs and an equal share of the accelerator.

    Ray keeps 4 decimals of fractional resources, so the share is rounded down (3 workers: 0.3333 each).
    """
    share = math.floor(10_000 / max(len(placement.components_on(device)), 1)) / 10_000
    options: dict[str, Any] = {"num_cpus": cpus_per_worker}
    if device_type == "cuda":
        options["num_gpus"] = share
    elif device_type == "npu":
        options["resources"] = {RAY_RESOURCE["npu"]: share}
    return options


def worker_threads(placement: Placement, node_cpus: list[float], role: str, devices: tuple[int, ...],
                   cpus_per_worker: float, env_threads: str) -> list[float]:
    """CPU threads of each worker of ``role`` on ``devices`` (what :func:`rlrunner.utils.threads.thread_env` sizes it
    for): its reservation ``cpus_per_worker``, or for env workers with ``cluster.env_threads: node`` their share
    of their node's CPUs (``node_cpus[k]`` for recipe node ``k``) by :func:`~rlrunner.utils.threads.node_share_threads`.
    """
    if role != "env" or env_threads != "node":
        return [cpus_per_worker] * len(devices)
    threads = []
    for device in devices:
        k = placement.node_of(device)
        on_node = [d for d in placement.used_devices if placement.node_of(d) == k]
        env_workers = sum(1 for d in on_node if "env" in placement.components_on(d))
        others = sum(len(placement.components_on(d)) for d in on_node) - env_workers
        threads.append(float(node_share_threads(node_cpus[k], env_workers, others, cpus_per_worker)))
    return threads
