"""Plain worker classes for the cluster tests (no Ray here: the backends wrap them)."""

from __future__ import annotations

import os
import time

import torch

from rlrunner.distributed.process_group import init_distributed


class Counter:
    """Holds a number; ``add`` changes it, ``value`` reads it."""

    def __init__(self, start: int = 0, *, rank: int, world_size: int, scale: int = 1) -> None:
        self.rank, self.world_size = rank, world_size
        self.total = start * scale + rank

    def add(self, x: int) -> int:
        self.total += x
        return self.total

    def value(self) -> int:
        return self.total

    def rendezvous_env(self) -> dict[str, str]:
        """The rendezvous env vars it was given (none: it forms no process group)."""
        return {k: v for k, v in os.environ.items() if k.startswith("MASTER_") or k == "RLRUNNER_DIST_TIMEOUT_S"}

    def identity(self) -> tuple[int, int]:
        return self.rank, self.world_size

    def env(self) -> dict[str, str]:
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        return {k: os.environ.get(k, "") for k in keys}

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def fail_on_rank(self, rank: int) -> int:
        if self.rank == rank:
            raise RuntimeError(f"boom on rank {rank}")
        return self.rank

    def exit_on_rank(self, rank: int) -> int:
        """Rank ``rank`` kills its own process; the others wait a little and answer."""
        if self.rank == rank:
            os._exit(1)
        time.sleep(0.5)
        return self.rank

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def tensors(self, n: int) -> dict[str, torch.Tensor]:
        """A large and a small result, for calls that keep the parts of a result apart."""
        return {"large": torch.full((n,), float(self.rank + 1)), "small": torch.tensor(self.rank)}

    def sum_of(self, tensors: list[torch.Tensor]) -> float:
        return float(sum(t.sum() for t in tensors))


class DataParallel:
    """Joins a gloo group in its constructor and averages a tensor across ranks (gradient averaging)."""

    forms_process_group = True

    def __init__(self, *, rank: int, world_size: int) -> None:
        self.rank = rank
        self.joined = init_distributed(rank, world_size, "cpu", timeout_s=60)
        self.grad = torch.full((3,), float(rank + 1))

    def average(self) -> list[float]:
        if not self.joined:  # one rank: nothing to average with
            return self.grad.tolist()
        total = self.grad.clone()
        torch.distributed.all_reduce(total)
        return (total / torch.distributed.get_world_size()).tolist()

    def env(self) -> dict[str, str]:
        return {k: os.environ.get(k, "") for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                                                    "RLRUNNER_DIST_TIMEOUT_S")}


class BrokenInit:
    """A constructor that raises."""

    def __init__(self, *, rank: int, world_size: int) -> None:
        raise OSError(f"cannot load weights on rank {rank}")


class PortCheckedBeforeJoining(DataParallel):
    """Before joining (where a real worker loads its model, for minutes) tries to take MASTER_PORT itself."""

    def __init__(self, *, rank: int, world_size: int) -> None:
        import socket

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("", int(os.environ["MASTER_PORT"])))
                self.port_was_free = True
            except OSError:
                self.port_was_free = False
        super().__init__(rank=rank, world_size=world_size)

    def port_free_before_join(self) -> bool:
        return self.port_was_free


class ThreadReport:
    """A real env worker (RapidOCR rewards) reporting its thread budget: torch's pool, OpenMP's setting, the threads
    its OCR engines were built with."""

    def __init__(self, *, rank: int, world_size: int) -> None:
        from omegaconf import OmegaConf

        from rlrunner.config.schema import EnvConfig
        from rlrunner.workers.reward import RewardWorker

        env_cfg = OmegaConf.structured(EnvConfig)
        for split in ("train", "eval"):
            env_cfg[split].reward.update(model="ocr", engine="rapidocr", num_workers=1)
        self.worker = RewardWorker(env_cfg, rank=rank, world_size=world_size)

    def report(self) -> dict:
        engines = {split: s.reward.engines._kwargs["num_threads"] for split, s in self.worker.scorers.items()}
        return {"torch": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"), "ocr_engines": engines,
                "cores_visible": len(os.sched_getaffinity(0))}
