"""The Ray backend (``cluster.backend: ray``): one placement group, one Ray actor per worker.

Every device of the placement is one bundle of the placement group -- ``{"GPU": 1, "CPU": c}`` on GPUs,
``{"NPU": 1, "CPU": c}`` on Ascend, ``{"CPU": c}`` without accelerators, where ``c = cpus_per_worker`` times
the number of components collocated on that device. Each bundle is pinned to the Ray node that holds its
device (recipe node ``d // devices_per_node``, mapped onto Ray nodes by :mod:`rlrunner.cluster.nodes`) with
a ``ray.io/node-id`` bundle label selector, and the placement is checked against the connected cluster's
nodes before anything starts. Collocated workers share their device's bundle, each with an equal fractional
share of the accelerator. Workers are plain classes: each runs inside a generic host actor
(:class:`~rlrunner.cluster.ray_host.WorkerHost`) that sets its torch.distributed env vars before calling its constructor. Ray is
imported lazily, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from rlrunner.cluster.base import Cluster, PendingCall, WorkerGroup, WorkerLocation
from rlrunner.cluster.errors import CollectiveFailed, WorkerError, WorkerLost, WorkerTimedOut, last_line
from rlrunner.cluster.nodes import NODE_ID_LABEL, RayNode, check_placement_fits, recipe_nodes
from rlrunner.cluster.placement import Placement, PlacementError, format_devices, parse_placement
from rlrunner.cluster.ray_host import host_actor
from rlrunner.cluster.ray_teardown import gcs_reachable, kill_hosts, release
from rlrunner.cluster.resources import (
    bundle_resources,
    detect_device_type,
    detect_devices_per_node,
    worker_resources,
    worker_threads,
)
from rlrunner.cluster.shipping import job_runtime_env, setup_failure
from rlrunner.distributed.process_group import worker_env
from rlrunner.utils.threads import thread_env

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
REJOIN_PROBE_S = 10.0  # rejoin: how long a new placement group may wait before the nodes are mapped again
_SPAWNS = itertools.count()  # makes the Ray actor names of this process unique


class _NotPlaced(RuntimeError):
    """Ray did not place the placement group's bundles in time."""


class RayPendingCall(PendingCall):
    """Object refs of a call in flight, one per called rank (a list of ``num_returns`` refs per rank when > 1)."""

    def __init__(self, group: RayWorkerGroup, method: str, refs: list[tuple[int, Any]], num_returns: int = 1):
        self._group, self._method, self._refs, self._num_returns = group, method, refs, num_returns
        self._results: list[Any] | None = None

    def get(self, timeout_s: float | None = None) -> list[Any]:
        if self._results is None and self._num_returns > 1:
            parts = [self.part(i).get(timeout_s) for i in range(self._num_returns)]
            self._results = [tuple(values) for values in zip(*parts)]
        elif self._results is None:
            self._results = self._group._gather(self._method, self._refs, timeout_s)
        return list(self._results)

    def done(self) -> bool:
        import ray

        refs = [ref for _, r in self._refs for ref in (r if self._num_returns > 1 else [r])]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return len(ready) == len(refs)

    def part(self, index: int) -> PendingCall:
        return RayPendingCall(self._group, self._method, [(rank, r[index]) for rank, r in self._refs])

    def handles(self) -> list[Any]:
        return [r for _, r in self._refs]


class RayWorkerGroup(WorkerGroup):
    """Workers of one role, each a Ray actor in its device's placement-group bundle."""

    def __init__(self, cluster: RayCluster, role: str, devices: tuple[int, ...], hosts: list[Any],
                 locations: list[WorkerLocation]):
        super().__init__(role, devices, locations)
        self._cluster, self._hosts = cluster, hosts

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> PendingCall:
        import ray

        self._check_ray(method)
        payload = ray.put((args, kwargs))  # serialised once, shared by every rank
        return self._submit(method, [(rank, payload) for rank in range(self.world_size)])

    def scatter_async(
        self, method: str, per_rank_args: Sequence[tuple], per_rank_kwargs: Sequence[dict] | None = None, *,
        per_rank_parts: Sequence[Sequence[Callable[[Any], Any]]] | None = None,
    ) -> PendingCall:
        self._check_ray(method)
        per_rank = self._per_rank(method, per_rank_args, per_rank_kwargs, per_rank_parts)
        return self._submit(method, list(enumerate(per_rank)), per_rank_parts)

    def call_rank_async(self, rank: int, method: str, *args: Any, **kwargs: Any) -> PendingCall:
        self._check_rank(rank)
        self._check_ray(method)
        return self._submit(method, [(rank, (args, kwargs))])

    def shutdown(self) -> None:
        kill_hosts(self._hosts)
        self._hosts = []
        self._cluster._forget(self)

    def _check_ray(self, method: str) -> None:
        """After a lost worker, before calling Ray: raise WorkerLost when Ray's GCS is gone (a signal that reached
        Ray's own services too), for the raylet went with it and Ray ends a process that touches its object store."""
        if self._cluster._worker_lost and self._hosts and not gcs_reachable():
            raise WorkerLost(self.role, 0, self.node_ips[0], f"was not called for {method!r}: Ray's GCS is gone "
                             "(did the signal reach Ray's own services too?)")

    def _submit(self, method: str, per_rank: list[tuple[int, Any]], parts: Sequence | None = None) -> PendingCall:
        if not self._hosts:
            raise RuntimeError(f"the {self.role} group is shut down")
        if parts is None:
            refs = [(rank, self._hosts[rank].execute.remote(method, payload)) for rank, payload in per_rank]
            return RayPendingCall(self, method, refs)
        refs = [(rank, self._hosts[rank].execute.options(num_returns=len(parts[rank])).remote(method, payload,
                                                                                             parts[rank]))
                for rank, payload in per_rank]
        return RayPendingCall(self, method, refs, len(parts[0]))

    def _gather(self, method: str, refs: list[tuple[int, Any]], timeout_s: float | None) -> list[Any]:
        try:
            return gather(self.role, self.node_ips, method, refs, timeout_s or self._cluster.worker_timeout_s)
        except WorkerError:
            self._cluster._worker_lost = True  # from now on each call first checks that Ray itself is still there
            raise


def gather(role: str, ips: Sequence[str], method: str, refs: list[tuple[int, Any]], timeout_s: float,
           nodes: Sequence[str] | None = None) -> list[Any]:
    """Results of ``refs`` (``(rank, ref)`` pairs) in order; the first failure or a timeout raises WorkerError
    (NodeSetupError when a node lacks rlrunner or a folder, naming rank r's node ``nodes[r]``, default ``ips[r]``).

    Fails fast: a rank that dies is reported as soon as Ray knows, even while other ranks still run (they may
    be blocked in a collective waiting for the dead one). The error's type says what happened, from the type of
    Ray's exception (never its text): :class:`WorkerLost` (the process or its node died, or a result it needed
    went with another worker), :class:`WorkerTimedOut`, :class:`CollectiveFailed` (torch.distributed raised), or
    a plain :class:`WorkerError` (the worker's code raised).
    """
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
    from torch.distributed import DistError

    deadline = time.monotonic() + timeout_s
    pending = {ref: rank for rank, ref in refs}
    results: dict[int, Any] = {}
    while pending:
        remaining = deadline - time.monotonic()
        ready = ray.wait(list(pending), num_returns=1, timeout=max(remaining, 0))[0] if remaining > 0 else []
        if not ready:
            late = sorted(pending.values())
            what = f"did not finish {method!r} within {timeout_s:g} s (cluster.worker_timeout_s); ranks still running: {late}"
            raise WorkerTimedOut(role, late[0], ips[late[0]], what)
        for ref in ready:
            rank = pending.pop(ref)
            try:
                results[rank] = ray.get(ref, timeout=max(deadline - time.monotonic(), 1.0))
            except RayTaskError as exc:
                text = _plain(str(exc))
                if setup := setup_failure(f"{role} worker rank {rank} on {(nodes or ips)[rank]}", text, exc.cause):
                    raise setup from None
                kind = (WorkerLost if isinstance(exc.cause, RayError)  # e.g. it fetched a dead worker's result
                        else CollectiveFailed if isinstance(exc.cause, DistError) else WorkerError)
                raise kind(role, rank, ips[rank], f"raised in {method!r}: {last_line(text)}", text) from None
            except RayActorError as exc:
                text = _plain(str(exc))
                if setup := setup_failure(f"{role} worker rank {rank} on {(nodes or ips)[rank]}", text):
                    raise setup from None
                what = f"died during {method!r} (its process exited or was killed)"
                raise WorkerLost(role, rank, ips[rank], what, text) from None
            except GetTimeoutError as exc:
                raise WorkerTimedOut(role, rank, ips[rank], f"did not return {method!r}'s result", repr(exc)) from None
            except RayError as exc:  # its result was lost (object lost, owner or node died)
                raise WorkerLost(role, rank, ips[rank], f"failed in {method!r}", repr(exc)) from None
    return [results[rank] for rank, _ in refs]


def _plain(text: str) -> str:
    """``text`` without the terminal colour codes Ray puts in remote tracebacks."""
    return _ANSI.sub("", text)


class RayCluster(Cluster):
    """Workers as Ray actors in one placement group sized from the placement, each bundle pinned to its node.

    Attributes:
        nodes: the Ray nodes in recipe order (``nodes[k]`` is recipe node ``k``; see
            :mod:`rlrunner.cluster.nodes`).
    """

    def __init__(self, cluster_cfg: Any, placement: Placement | None = None) -> None:
        self._started_ray = False
        self._pg = None
        self._worker_lost = False  # a worker failed since the placement group was placed (RayWorkerGroup._check_ray)
        self.cpus_per_worker = float(getattr(cluster_cfg, "cpus_per_worker", 1.0))
        self.env_threads = str(getattr(cluster_cfg, "env_threads", "reserved"))
        try:
            placement, cluster_name = self._connect(cluster_cfg, placement)
            super().__init__(placement, detect_device_type(), getattr(cluster_cfg, "worker_timeout_s", 1800.0))
            self._cluster_name = cluster_name
            self.nodes = self._check_nodes(cluster_name)
            self._slots_used = {d: 0 for d in placement.used_devices}
            self._pg, self._bundle_index = self._create_placement_group(self.worker_timeout_s,
                                                                        "cluster.worker_timeout_s")
        except BaseException:
            self._release()
            raise

    def _connect(self, cluster_cfg: Any, placement: Placement | None) -> tuple[Placement, str]:
        """Join ``ray_address`` / ``RAY_ADDRESS`` or start a local Ray sized for the placement.

        Returns the placement and how error messages name the cluster.
        """
        import ray

        address = getattr(cluster_cfg, "ray_address", "") or os.environ.get("RAY_ADDRESS", "")
        if not ray.is_initialized() and address:
            runtime_env = job_runtime_env(bool(getattr(cluster_cfg, "ship_code", True)))  # nodes lack the checkout
            ray.init(address=address, log_to_driver=True, runtime_env=runtime_env)
            self._started_ray = True
        if placement is None:  # after connecting, so detection sees the cluster's nodes
            n_per_node = detect_devices_per_node(cluster_cfg)
            placement = parse_placement(cluster_cfg.component_placement, cluster_cfg.num_nodes, n_per_node)
        if ray.is_initialized():
            return placement, f"the Ray cluster at {ray.get_runtime_context().gcs_address}"
        need_cpus = self.cpus_per_worker * sum(len(placement.components_on(d)) for d in placement.used_devices)
        num_cpus = max(os.cpu_count() or 1, math.ceil(need_cpus) + 1)  # +1: room for plain tasks
        # address='local': always a new instance, never a Ray that someone else started on this machine
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
        self._started_ray = True
        return placement, "the one-node Ray started on this machine (set cluster.ray_address to join a cluster)"

    # ------------------------------------------------------------------------------------ resources

    def _check_nodes(self, cluster_name: str) -> list[RayNode]:
        """The cluster's nodes in recipe order, after checking that every device of the placement exists."""
        import ray

        nodes = recipe_nodes(ray.nodes(), self.device_type)
        check_placement_fits(self.placement, nodes, self.device_type, self.cpus_per_worker, cluster_name)
        return nodes

    def rejoin(self, timeout_s: float) -> None:
        """Give the placement group back, wait until the alive nodes fit the placement again (a lost node back, or
        another in its place: recipe node ``k`` is mapped anew) and place a new one, all within ``timeout_s``.

        Ray reports a lost node as alive until its health checks fail, so a group pinned to it never becomes
        ready: it is given back after :data:`REJOIN_PROBE_S` and the nodes are mapped again.
        """
        import ray

        deadline = time.monotonic() + timeout_s
        while True:
            if self._pg is not None:
                with contextlib.suppress(Exception):
                    ray.util.remove_placement_group(self._pg)
                self._pg = None
            try:
                self.nodes = self._check_nodes(self._cluster_name)
                self._slots_used = {d: 0 for d in self.placement.used_devices}
                probe = min(REJOIN_PROBE_S, max(deadline - time.monotonic(), 1.0))
                self._pg, self._bundle_index = self._create_placement_group(probe, "cluster.rejoin_timeout_s")
                self._worker_lost = False
                return
            except (PlacementError, _NotPlaced) as err:
                if time.monotonic() >= deadline:
                    raise PlacementError(f"{err} (waited {timeout_s:g} s, cluster.rejoin_timeout_s, for the "
                                         "cluster to hold the placement again)") from None
                time.sleep(1.0)

    def _create_placement_group(self, timeout_s: float, timeout_key: str) -> tuple[Any, dict[int, int]]:
        """One bundle per used device, each pinned by label to the Ray node of its recipe node; ``timeout_s``
        (the recipe's ``timeout_key``) bounds the wait for Ray to place them."""
        import ray
        from ray.util.placement_group import placement_group, placement_group_table

        devices = self.placement.used_devices
        bundles = [bundle_resources(self.placement, d, self.device_type, self.cpus_per_worker) for d in devices]
        node_ids = [self.nodes[self.placement.node_of(d)].node_id for d in devices]
        # PACK, not STRICT_PACK: Ray releases before ray-project/ray#60170 ignore label selectors under STRICT_PACK
        pg = placement_group(bundles, strategy="PACK", name=f"rlrunner-{os.getpid()}-{id(self):x}",
                             bundle_label_selector=[{NODE_ID_LABEL: node_id} for node_id in node_ids])
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(pg)
            raise _NotPlaced(
                f"Ray could not place the {len(bundles)} bundles of devices {format_devices(devices)} on their "
                f"nodes within {timeout_s:g} s ({timeout_key}); other jobs may hold the resources"
            ) from None
        placed = placement_group_table(pg)["bundles_to_node_id"]
        for index, (device, node_id) in enumerate(zip(devices, node_ids)):
            if placed[index] != node_id:  # a Ray that ignores label selectors must not break the contract
                ray.util.remove_placement_group(pg)
                raise RuntimeError(
                    f"Ray put the bundle of device {device} on node {placed[index]}, not on recipe node "
                    f"{self.placement.node_of(device)} ({node_id}); this Ray ignores bundle label selectors, "
                    "upgrade it"
                )
        return pg, {d: i for i, d in enumerate(devices)}

    def _take_slots(self, role: str, devices: tuple[int, ...]) -> None:
        for d in devices:
            if d not in self._bundle_index:
                raise ValueError(
                    f"spawn({role!r}): device {d} is not used by the placement (devices "
                    f"{format_devices(self.placement.used_devices)} have bundles)"
                )
            capacity = len(self.placement.components_on(d))
            if self._slots_used[d] >= capacity:
                raise ValueError(
                    f"spawn({role!r}): device {d} already holds {capacity} worker(s), as many as the placement "
                    f"collocates there ({', '.join(self.placement.components_on(d))}); shut a group down first"
                )
        for d in devices:
            self._slots_used[d] += 1

    # ------------------------------------------------------------------------------------- workers

    def spawn(self, role: str, worker_cls: type, devices: tuple[int, ...], *args: Any, **kwargs: Any) -> WorkerGroup:
        devices = self._check_spawn(role, worker_cls, devices)
        self._take_slots(role, devices)
        hosts: list[Any] = []
        try:
            serial = next(_SPAWNS)
            hosts = [self._start_host(d, f"rlrunner-{role}-{rank}-{serial}") for rank, d in enumerate(devices)]
            # only a group that forms a process group (the actor's) waits on collectives, and binds a rendezvous
            # store when it has 2+ ranks (one rank forms its group alone, actor.one_rank_group)
            forms = getattr(worker_cls, "forms_process_group", False)  # a bool, or a function of the spawn's arguments
            forms = forms(*args, **kwargs) if callable(forms) else forms
            timeout = self.worker_timeout_s if forms else None
            rendezvous = timeout is not None and len(devices) > 1
            started = [(rank, h.node_info.remote(timeout if rank == 0 and rendezvous else None))
                       for rank, h in enumerate(hosts)]
            names = [f"node {k} = {self.nodes[k].describe()}" for k in map(self.placement.node_of, devices)]  # pinned
            infos = gather(role, names, "start", started, self.worker_timeout_s)
            ips, node_ids = [i["node_ip"] for i in infos], [i["node_id"] for i in infos]
            master = (ips[0], infos[0]["port"], timeout) if rendezvous else (None, None, timeout)
            threads = worker_threads(self.placement, [n.cpus for n in self.nodes], role, devices,
                                     self.cpus_per_worker, self.env_threads)
            refs = [
                (rank, host.construct.remote({**self._env(rank, node_ids, *master), **thread_env(threads[rank])},
                                             worker_cls, args, kwargs))
                for rank, host in enumerate(hosts)
            ]
            gather(role, ips, f"{worker_cls.__name__}.__init__", refs, self.worker_timeout_s, nodes=names)
        except BaseException:  # includes KeyboardInterrupt: never leak actors or slots
            kill_hosts(hosts)
            for d in devices:
                self._slots_used[d] -= 1
            raise
        locations = [WorkerLocation(role, rank, info["node_id"], info["node_ip"], info["device"])
                     for rank, info in enumerate(infos)]
        group = RayWorkerGroup(self, role, devices, hosts, locations)
        self._groups.append(group)
        return group

    @staticmethod
    def _env(rank: int, node_ids: list[str], master_addr: str | None, master_port: int | None,
             timeout_s: float | None) -> dict[str, str]:
        """torch.distributed env vars of ``rank``; LOCAL_RANK counts the group's ranks on the same node (by
        node id: several nodes may share one IP)."""
        same_node = [r for r, node_id in enumerate(node_ids) if node_id == node_ids[rank]]
        return worker_env(rank, len(node_ids), same_node.index(rank), len(same_node), master_addr, master_port,
                          timeout_s)

    def _start_host(self, device: int, name: str) -> Any:
        """A host actor in ``device``'s bundle, named ``name`` (how ``ray list actors`` shows it)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=self._bundle_index[device])
        options = worker_resources(self.placement, device, self.device_type, self.cpus_per_worker)
        return host_actor().options(scheduling_strategy=strategy, name=name, **options).remote()

    def _forget(self, group: WorkerGroup) -> None:
        if group in self._groups:
            for d in group.devices:
                self._slots_used[d] -= 1
        super()._forget(group)

    def _release(self) -> None:
        release(self._pg, self._started_ray)  # skips what needs a GCS that is gone, never blocks for long
        self._pg, self._started_ray = None, False
