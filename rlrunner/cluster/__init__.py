"""Where workers run: placement parsing, the Ray backend and the in-process backend.

Only this package knows Ray. The driver builds a cluster, spawns one worker group per component and calls
the groups; workers are plain classes and never call each other::

    placement = parse_placement(cfg.cluster.component_placement, cfg.cluster.num_nodes,
                                detect_devices_per_node(cfg.cluster))      # validate before anything starts
    with create_cluster(cfg.cluster, placement) as cluster:
        actor = cluster.spawn("actor", ActorWorker, placement.devices["actor"], cfg.actor)
        losses = actor.call("update", batch)                               # one result per rank
"""

from rlrunner.cluster.base import Cluster, PendingCall, WorkerError, WorkerGroup
from rlrunner.cluster.distributed import init_distributed
from rlrunner.cluster.factory import BACKENDS, create_cluster
from rlrunner.cluster.placement import COMPONENTS, Placement, format_devices, parse_placement
from rlrunner.cluster.resources import detect_device_type, detect_devices_per_node

__all__ = [
    "BACKENDS",
    "COMPONENTS",
    "Cluster",
    "PendingCall",
    "Placement",
    "WorkerError",
    "WorkerGroup",
    "create_cluster",
    "detect_device_type",
    "detect_devices_per_node",
    "format_devices",
    "init_distributed",
    "parse_placement",
]
