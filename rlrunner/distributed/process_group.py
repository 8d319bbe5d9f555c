"""torch.distributed set-up for the data-parallel workers of one group. No Ray here.

The cluster backend gives every worker of a group the usual env vars before its constructor runs
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, and for a group that forms a process group
``MASTER_ADDR``, ``MASTER_PORT`` and :data:`TIMEOUT_ENV`); a worker class that averages gradients declares
``forms_process_group`` (True, or a function of its spawn arguments: the rollout forms one for context
parallelism only), calls :func:`init_distributed` in its constructor and then trains through
:func:`rlrunner.distributed.parallelize.parallelize` (DDP or FSDP2). Under Ray each worker sees only its own
accelerator, as device 0, unless ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` is set: then its device is the one
Ray assigned (:func:`rlrunner.utils.device.ray_device_index`).

No port race: under Ray, rank 0's process binds the group's rendezvous store (:func:`bind_rendezvous`, a TCPStore
on a port the OS picks, on the node's IP only) before any worker is built, and that port becomes ``MASTER_PORT``.
The group forms only when the workers call :func:`init_distributed`, after their model has loaded (minutes for a
large one), but the port was held the whole time, so no other process can take it in between. Groups that form no
process group (rollout, env) bind nothing. Rendezvous and collectives wait ``cluster.worker_timeout_s``.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from rlrunner.utils.device import DEVICE_INDEX_ENV

# device kind -> torch.distributed backend
DIST_BACKENDS: dict[str, str] = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}

# set by the in-process ("local") backend: all ranks share one process, so no process group can form
IN_PROCESS_ENV = "RLRUNNER_IN_PROCESS"
# seconds the rendezvous and collectives wait for the other ranks (cluster.worker_timeout_s, set by the cluster)
TIMEOUT_ENV = "RLRUNNER_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800.0  # cluster.worker_timeout_s's default
# the rendezvous store rank 0's process bound before its worker was built (bind_rendezvous); None elsewhere
_RENDEZVOUS: dist.TCPStore | None = None


def find_free_port() -> int:
    """A TCP port that is free on this machine right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def bind_rendezvous(host: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Bind this process's rendezvous store (rank 0 of a group) on a free port of address ``host`` (the node's IP)
    and return the port; it stays bound until the process ends, and :func:`init_distributed` on rank 0 forms the
    group over it. Idempotent.

    The socket is bound here and handed to the store: a TCPStore given a host name still listens on every interface.
    """
    global _RENDEZVOUS
    if _RENDEZVOUS is None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.bind((host, 0))
        listener.listen()
        port = int(listener.getsockname()[1])
        _RENDEZVOUS = dist.TCPStore(host, port, None, is_master=True, timeout=timedelta(seconds=timeout_s),
                                    wait_for_workers=False, master_listen_fd=listener.detach())
    return int(_RENDEZVOUS.port)


def worker_env(rank: int, world_size: int, local_rank: int, local_world_size: int, master_addr: str | None = None,
               master_port: int | None = None, timeout_s: float | None = None) -> dict[str, str]:
    """The env vars a worker of a group gets before its constructor runs; the rendezvous (``MASTER_*``) and its
    timeout only where a process group forms."""
    env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local_rank),
           "LOCAL_WORLD_SIZE": str(local_world_size)}
    if master_addr is not None and master_port is not None:
        env.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
    if timeout_s is not None:
        env[TIMEOUT_ENV] = str(timeout_s)
    return env


def init_distributed(rank: int, world_size: int, device_type: str, timeout_s: float | None = None, *,
                     one_rank_group: bool = False) -> bool:
    """Join the group's default process group (gloo on CPU, nccl on CUDA, hccl on NPU).

    Reads ``MASTER_ADDR`` / ``MASTER_PORT`` from the environment (set by the cluster backend). All ranks
    must call it at the same time, e.g. from their constructors.

    Args:
        rank: this worker's rank in ``0 .. world_size - 1``.
        world_size: number of workers in the group; 1 makes this a no-op unless ``one_rank_group``.
        device_type: ``"cpu"``, ``"cuda"`` or ``"npu"``.
        timeout_s: how long collectives (and the rendezvous) wait for the other ranks; None: :data:`TIMEOUT_ENV`
            (the cluster sets it from ``cluster.worker_timeout_s``), else :data:`DEFAULT_TIMEOUT_S`.
        one_rank_group: with ``world_size == 1``, form a process group of this rank alone (an in-memory store, no
            network), so that FSDP2 shards over a one-rank mesh (``actor.one_rank_group``).

    Returns:
        True when a process group is (now) initialised, False for ``world_size == 1`` without ``one_rank_group``.
    """
    if device_type not in DIST_BACKENDS:
        raise ValueError(f"unknown device type {device_type!r}; valid: {', '.join(DIST_BACKENDS)}")
    timeout = timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)) if timeout_s is None
                        else timeout_s)
    if world_size == 1 and one_rank_group:
        if not dist.is_initialized():
            _set_local_device(device_type)
            dist.init_process_group(backend=DIST_BACKENDS[device_type], store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timeout)
        return True
    if world_size <= 1:
        return False
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    if os.environ.get(IN_PROCESS_ENV):
        raise RuntimeError(
            f"init_distributed(world_size={world_size}) under the in-process 'local' backend: all ranks share "
            "one process, so torch.distributed cannot form a group; use cluster.backend=ray or one device"
        )
    if dist.is_initialized():
        if dist.get_world_size() != world_size or dist.get_rank() != rank:
            raise RuntimeError(
                f"a process group (rank {dist.get_rank()} of {dist.get_world_size()}) already exists; "
                f"asked for rank {rank} of {world_size}"
            )
        return True
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise ValueError(
            f"init_distributed needs env vars {', '.join(missing)}; spawn workers through rlrunner.cluster, whose "
            "backends set them for worker classes that declare forms_process_group = True"
        )
    _set_local_device(device_type)
    store = _RENDEZVOUS if rank == 0 and _RENDEZVOUS is not None else dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=rank == 0, timeout=timeout)
    store.set_timeout(timeout)
    dist.init_process_group(backend=DIST_BACKENDS[device_type], store=store, rank=rank, world_size=world_size,
                            timeout=timeout)
    return True


def _set_local_device(device_type: str) -> None:
    if device_type == "cuda":
        torch.cuda.set_device(_local_device_index(torch.cuda.device_count()))
    elif device_type == "npu":
        import torch_npu  # noqa: F401  (registers torch.npu and the hccl backend)

        torch.npu.set_device(_local_device_index(torch.npu.device_count()))


def _local_device_index(visible: int) -> int:
    """The device the cluster assigned (:data:`DEVICE_INDEX_ENV`, under Ray's NOSET_*_VISIBLE_DEVICES), else
    ``LOCAL_RANK`` when this process sees all devices of its node, else 0 (Ray shows each worker one)."""
    if os.environ.get(DEVICE_INDEX_ENV):
        return int(os.environ[DEVICE_INDEX_ENV])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return local_rank if local_rank < visible else 0
