"""What accelerators the cluster has (device kind, devices per node), and what each worker reserves of them.

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
