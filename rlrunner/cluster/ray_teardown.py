"""Teardown of the Ray backend that never waits long on Ray, even when Ray's own services are gone.

A stop signal that reaches every process of a job (Slurm's GraceTime, ``scancel`` without ``-b``, a time limit
without ``--signal=B:``) stops the GCS and the raylet of a Ray the driver started, together with the workers. Ray's
calls that need the GCS (removing a placement group) then retry until the driver's core worker gives up on it after
60 s and ends the process with status 1, before the launcher can print how the run ended (docs/runs.md "Preemption and
recovery"). So teardown asks first whether the GCS still accepts connections (:func:`gcs_reachable`, at most
:data:`GCS_PROBE_S`) and skips what needs it when not: the actors and the placement group went with it. What it still
calls runs at most :data:`TEARDOWN_CALL_S` (a GCS that dies during the call), then is left behind. The raylet goes
with the GCS, and Ray ends a process at once that then touches its object store: so after a lost worker the groups
of :mod:`rlrunner.cluster.ray_backend` probe the GCS before each call too, and raise WorkerLost when it is gone.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger("rlrunner")

GCS_PROBE_S = 2.0  # how long a connection to the GCS may take before it counts as gone
TEARDOWN_CALL_S = 10.0  # how long one Ray call of the teardown may run before it is left behind


def gcs_reachable(timeout_s: float = GCS_PROBE_S) -> bool:
    """Whether the GCS of the Ray this process is connected to accepts a TCP connection within ``timeout_s``
    (False when not connected). A GCS that was stopped refuses at once; one on a lost node times out."""
    import ray

    return ray.is_initialized() and accepts_connections(ray.get_runtime_context().gcs_address, timeout_s)


def accepts_connections(address: str, timeout_s: float) -> bool:
    """Whether ``address`` (``host:port``, ``[v6]:port``) accepts a TCP connection within ``timeout_s``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):  # refused, timed out, unreachable, or no port
        return False


def bounded(call: Callable[[], Any], what: str, timeout_s: float = TEARDOWN_CALL_S) -> bool:
    """Run ``call`` (its errors suppressed: Ray may be going down) in a daemon thread for at most ``timeout_s``;
    whether it returned in time. A call still blocked is left behind with a warning that names ``what``."""
    thread = threading.Thread(target=_quietly, args=(call,), name=f"rlrunner-teardown-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        logger.warning("Ray did not %s within %g s (its GCS may be gone); left it behind", what, timeout_s)
        return False
    return True


def _quietly(call: Callable[[], Any]) -> None:
    with contextlib.suppress(Exception):  # already dead, or Ray is going down
        call()


def kill_hosts(hosts: Sequence[Any]) -> None:
    """Kill the host actors ``hosts`` (dead ones too); nothing to do when the GCS is gone, which kills actors: they
    went with it (their raylet ends them when it loses the GCS)."""
    import ray

    if hosts and gcs_reachable():
        for host in hosts:
            with contextlib.suppress(Exception):
                ray.kill(host, no_restart=True)


def release(pg: Any, started_ray: bool) -> None:
    """Give the placement group ``pg`` back (None: there is none), unless the GCS that holds it is gone, then shut
    down the Ray this process started (``started_ray``; Ray's own shutdown is bounded when its services are gone)."""
    import ray

    if pg is not None and gcs_reachable():
        bounded(lambda: ray.util.remove_placement_group(pg), "remove the placement group")
    elif pg is not None:
        logger.warning("Ray's GCS is gone (did the signal reach Ray's own services too?): its placement group and "
                       "the workers went with it")
    if started_ray and ray.is_initialized():
        ray.shutdown()
