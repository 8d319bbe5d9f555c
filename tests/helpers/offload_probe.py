"""Host memory made visible on CPU, for the offload tests: an accelerator's process group (NCCL) has no host-memory
path, but on CPU an "offloaded" actor stays where it was, so nothing would fail.

:func:`install` runs in every Ray worker process (``runtime_env={"worker_process_setup_hook":
"offload_probe.install"}``): it marks the process's actor as in host memory between ``ActorWorker.offload`` and
``ActorWorker.onload`` (on a GPU exactly where its tensors are on the CPU), and wraps the collectives that
torch.distributed, FSDP2 and DTensor gathers go through (``DTensor.redistribute`` is what ``full_tensor`` and
``get_optimizer_state_dict(full_state_dict=True)`` call). Each collective is logged with its tensors' device kind
(``host`` while offloaded) to ``$RLRUNNER_TEST_COLLECTIVES/<pid>.jsonl``, and one on host memory raises, as NCCL
would.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

LOG_DIR_ENV = "RLRUNNER_TEST_COLLECTIVES"
COLLECTIVES = ("all_gather_single", "all_gather_into_tensor", "all_gather", "reduce_scatter_single",
               "reduce_scatter_tensor", "all_reduce", "broadcast")


def install() -> None:
    log_dir = os.environ.get(LOG_DIR_ENV)
    if not log_dir:
        return
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from rlrunner.workers.actor import ActorWorker

    log, on_host = Path(log_dir) / f"{os.getpid()}.jsonl", [False]

    def record(**event: Any) -> None:
        with log.open("a") as f:
            f.write(json.dumps(event) + "\n")

    def residency(method: str, host: bool) -> None:
        original = getattr(ActorWorker, method)

        @functools.wraps(original)
        def moved(self: ActorWorker) -> None:
            original(self)
            on_host[0] = host
            record(event=method)

        setattr(ActorWorker, method, moved)

    def checked(owner: Any, name: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            devices = sorted({"host" if on_host[0] else t.device.type for t in tensors})
            record(event="collective", op=name, devices=devices)
            if on_host[0]:
                raise RuntimeError(f"{name} on tensors in host memory (the actor is offloaded): the device's "
                                   f"backend (NCCL) cannot gather them")
            return original(*args, **kwargs)

        setattr(owner, name, collective)

    residency("offload", True)
    residency("onload", False)
    for name in COLLECTIVES:
        if hasattr(dist, name):
            checked(dist, name)
    checked(DTensor, "redistribute")
