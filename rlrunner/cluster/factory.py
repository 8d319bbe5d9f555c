"""``create_cluster``: the backend named by ``cluster.backend``, from a registry."""

from __future__ import annotations

from typing import Any

from rlrunner.cluster.base import Cluster
from rlrunner.cluster.local import LocalCluster
from rlrunner.cluster.placement import Placement
from rlrunner.cluster.ray_backend import RayCluster

# cluster.backend -> Cluster class; each is built as cls(cluster_cfg, placement)
BACKENDS: dict[str, type[Cluster]] = {"local": LocalCluster, "ray": RayCluster}


def create_cluster(cluster_cfg: Any, placement: Placement | None = None) -> Cluster:
    """Start (or connect to) the cluster described by ``cluster_cfg`` (a ClusterConfig).

    Args:
        cluster_cfg: the ``cluster`` section of the recipe.
        placement: an already parsed placement (e.g. from config validation); None parses
            ``cluster_cfg.component_placement`` with :func:`detect_devices_per_node` -- for Ray after connecting,
            so the devices of the cluster's nodes are counted rather than the driver's.

    Returns:
        A :class:`Cluster`; use it as a context manager so that Ctrl-C still stops every worker.
    """
    backend = getattr(cluster_cfg, "backend", "ray")
    if backend not in BACKENDS:
        raise ValueError(f"unknown cluster.backend {backend!r}; valid: {', '.join(sorted(BACKENDS))}")
    return BACKENDS[backend](cluster_cfg, placement)
