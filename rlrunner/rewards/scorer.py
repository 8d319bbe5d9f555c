"""Asynchronous reward scoring, so the runner can overlap OCR with the next rollout.

    with AsyncRewardScorer(reward, num_workers=2) as scorer:
        future = scorer.submit(images, prompts)     # returns at once
        ...                                         # next rollout
        out = future.result()                       # RewardOutput of exactly that batch

Threads, not processes: ONNX Runtime and Paddle release the GIL during inference, so threads scale with cores
without pickling image batches to other processes (measured in ``bench/ocr_throughput.py``). Each submitted batch
is one task for one of the ``num_workers`` threads (each borrows its own OCR engine with ``cpus / num_workers``
inference threads, ``cpus`` being the worker's CPU reservation); the scorer never splits a batch itself:
``submit_all`` takes the slices the driver cut (:func:`rlrunner.step.shares.reward_slices`, the one place where reward
work is divided) and joins their outputs in order.
No Ray here: the cluster layer can wrap the scorer or the reward in an actor.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from .output import RewardOutput
from .registry import Reward, score

if TYPE_CHECKING:
    from typing_extensions import Self


class AsyncRewardScorer:
    """Runs ``reward(images, prompts)`` on a pool of ``num_workers`` threads.

    ``submit`` copies its inputs (the caller may reuse its buffers) and returns a ``Future[RewardOutput]``; each
    future holds the output of its own submission, so results come back in submission order. An exception that
    escapes the reward (a caller bug such as a shape mismatch) is set on the future.
    """

    def __init__(self, reward: Reward, num_workers: int = 1) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.reward = reward
        self.num_workers = num_workers
        self._pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="reward")
        self._closed = False

    def submit(self, images: np.ndarray, prompts: list[str],
               metadata: list[dict[str, Any]] | None = None) -> Future[RewardOutput]:
        """Queue one batch (images ``[B, ...]``, ``B`` prompts, optional ``B`` metadata dicts for a reward that
        uses them) as one task; returns its future at once."""
        if self._closed:
            raise RuntimeError("AsyncRewardScorer is closed")
        images = np.array(images, copy=True)
        prompts = list(prompts)
        if len(prompts) != len(images):
            raise ValueError(f"Got {len(images)} images but {len(prompts)} prompts")
        return self._pool.submit(score, self.reward, images, prompts, metadata)

    def submit_all(self, batches: list[tuple]) -> Future[RewardOutput]:
        """Queue each ``(images, prompts[, metadata])`` slice as its own task (they run in parallel on the threads);
        returns one future of their outputs joined in order."""
        return _gather([self.submit(*batch) for batch in batches])

    def close(self, wait: bool = True) -> None:
        """Stop accepting work; with ``wait``, block until submitted batches are done."""
        self._closed = True
        self._pool.shutdown(wait=wait, cancel_futures=not wait)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _gather(parts: list[Future[RewardOutput]]) -> Future[RewardOutput]:
    """A future that resolves to the concatenation of ``parts`` (in order) once all are done."""
    if len(parts) == 1:
        return parts[0]
    result: Future[RewardOutput] = Future()
    remaining = [len(parts)]
    lock = threading.Lock()

    def done(_: Future) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        try:
            result.set_result(RewardOutput.concat([p.result() for p in parts]))
        except BaseException as err:  # noqa: BLE001  includes CancelledError of a cancelled slice
            result.set_exception(err)

    for part in parts:
        part.add_done_callback(done)
    return result
