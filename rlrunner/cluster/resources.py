"""What accelerators the cluster has: device kind and devices per node.

Asks a connected Ray cluster first (its nodes may differ from the driver's machine), then torch on this
machine, and falls back to one CPU "device" per node. Ray is consulted only when this process has already
connected to it; nothing here starts Ray.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from rlrunner.cluster.nodes import RAY_RESOURCE, alive_nodes
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
