"""The body of every Ray actor of the Ray backend (:mod:`rlrunner.cluster.ray_backend`): it checks the worker's
folders on its node, sets the worker's env vars and thread budget, builds the worker and forwards calls to its
public methods, fetching object references in the arguments itself."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from rlrunner.cluster.base import split_parts
from rlrunner.cluster.ray_refs import resolve_refs
from rlrunner.cluster.shipping import check_readable
from rlrunner.distributed.process_group import bind_rendezvous
from rlrunner.utils.device import use_ray_assigned_device
from rlrunner.utils.threads import apply_thread_budget

_HOST_ACTOR = None  # ray.remote(WorkerHost), built on first use
# Ray accelerator resource -> torch device kind, for the device a worker reports
_TORCH_KIND = {"GPU": "cuda", "NPU": "npu"}


class WorkerHost:
    """Body of every Ray actor: holds one worker object and forwards calls to its public methods."""

    def __init__(self) -> None:
        self.worker: Any = None

    def node_info(self, rendezvous_timeout_s: float | None) -> dict[str, Any]:
        """Where this actor runs (node IP and id, the accelerator Ray gave it) and, for rank 0 of a group that forms
        a process group (``rendezvous_timeout_s`` given), the port of the rendezvous store it binds now on the node's
        IP and holds (MASTER_PORT: nothing can take it before the group forms, see
        :mod:`rlrunner.distributed.process_group`)."""
        import ray

        context = ray.get_runtime_context()
        accelerators = context.get_accelerator_ids()
        device = next((f"{kind}:{','.join(accelerators[name])}" for name, kind in _TORCH_KIND.items()
                       if accelerators.get(name)), "cpu")
        node_ip = ray.util.get_node_ip_address()
        port = None if rendezvous_timeout_s is None else bind_rendezvous(node_ip, rendezvous_timeout_s)
        return {"node_ip": node_ip, "node_id": context.get_node_id(), "device": device, "port": port}

    def construct(self, env: dict[str, str], worker_cls: type, args: tuple, kwargs: dict) -> None:
        """Set the env vars (torch.distributed's, the thread budget's), then build ``worker_cls(*args, rank=RANK,
        world_size=WORLD_SIZE, **kwargs)``, once this node can read the folders it loads (its ``node_paths``)."""
        import ray

        node_paths = getattr(worker_cls, "node_paths", None)
        if node_paths is not None:
            check_readable(node_paths(*args, **kwargs))
        os.environ.update(env)
        # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: the worker sees every device; its own is Ray's, not device 0
        use_ray_assigned_device(ray.get_runtime_context().get_accelerator_ids(), os.environ)
        apply_thread_budget()  # the worker's threads follow its CPU reservation, not the node's core count
        self.worker = worker_cls(*args, rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]), **kwargs)

    def execute(self, method: str, payload: tuple[tuple, dict], parts: Sequence[Callable] | None = None) -> Any:
        """Call ``worker.method(*args, **kwargs)``; only public methods are reachable.

        Object references inside the arguments (handles of another group's results) are fetched here, by this
        process, so the worker receives values and the data never pass through the driver. With ``parts`` the
        result is split here into separate return objects (the call was made with ``num_returns=len(parts)``).
        """
        fn = getattr(self.worker, method, None)
        if method.startswith("_") or not callable(fn):
            raise AttributeError(f"{type(self.worker).__name__} has no public method {method!r}")
        args, kwargs = resolve_refs(payload)
        result = fn(*args, **kwargs)
        return result if parts is None else split_parts(result, parts)


def host_actor() -> Any:
    global _HOST_ACTOR
    if _HOST_ACTOR is None:
        import ray

        _HOST_ACTOR = ray.remote(max_restarts=0, max_task_retries=0)(WorkerHost)
    return _HOST_ACTOR
