"""Where workers run: placement parsing, the Ray backend and the in-process backend.

Only this package knows Ray; the torch engines its workers train with (process groups, DDP, FSDP2, context parallelism)
are :mod:`rlrunner.distributed`. The driver builds a cluster, spawns one worker group per component and calls the
groups; workers are plain classes and never call each other::

    placement = parse_placement(cfg.cluster.component_placement, cfg.cluster.num_nodes,
                                detect_devices_per_node(cfg.cluster))      # validate before anything starts
    with create_cluster(cfg.cluster, placement) as cluster:
        actor = cluster.spawn("actor", ActorWorker, placement.devices["actor"], cfg.actor)
        adapters = actor.call("lora_weights")                              # one result per rank

Data goes from worker to worker without the driver: a call's result (or a part of it, ``per_rank_parts``) stays
where it was computed, and its ``handles()`` passed as arguments of another group's call reach that group's
workers as values (Ray: object references fetched by the receiving process; in-process: the objects)::

    pending = rollout.scatter_async("generate", args, per_rank_parts=[(attrgetter("train"), attrgetter("scored"))] * n)
    env.scatter("submit", [(handle,) for handle in pending.part(1).handles()])

The checks of the cluster's keys are in ``checks.py``; how batches, prompts and context-parallel groups share the
placed devices is checked by :func:`rlrunner.step.checks.check_placement`.

May import: rlrunner.config, rlrunner.distributed, rlrunner.utils
"""

from rlrunner.cluster.base import Cluster, Handle, PendingCall, WorkerGroup, WorkerLocation
from rlrunner.cluster.errors import CollectiveFailed, WorkerError, WorkerLost, WorkerTimedOut
from rlrunner.cluster.factory import BACKENDS, create_cluster
from rlrunner.cluster.placement import COMPONENTS, Placement, PlacementError, format_devices, parse_placement
from rlrunner.cluster.report import write_placement_report
from rlrunner.cluster.resources import detect_device_type, detect_devices_per_node
from rlrunner.cluster.shipping import NodeSetupError

__all__ = [
    "BACKENDS",
    "COMPONENTS",
    "Cluster",
    "CollectiveFailed",
    "Handle",
    "NodeSetupError",
    "PendingCall",
    "Placement",
    "PlacementError",
    "WorkerError",
    "WorkerGroup",
    "WorkerLocation",
    "WorkerLost",
    "WorkerTimedOut",
    "create_cluster",
    "detect_device_type",
    "detect_devices_per_node",
    "format_devices",
    "parse_placement",
    "write_placement_report",
]
