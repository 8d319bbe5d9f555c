"""AsyncRewardScorer: futures in submission order, slices in parallel and rejoined in order, errors, input copies."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from reward_helpers import coded_image

from rlrunner.config.schema import RewardConfig
from rlrunner.rewards import AsyncRewardScorer, Reward, RewardOutput, build_reward


class SlowMean(Reward):
    """avg = mean pixel / 255; sleeps longer for earlier batches so later submissions finish first."""

    name = "slow_mean"

    def __init__(self) -> None:
        super().__init__(RewardConfig())
        self.threads: set[str] = set()
        self.delay = 0.0  # seconds every call sleeps (on top of the "slow" prompt)
        self.lock = threading.Lock()

    def __call__(self, images: np.ndarray, prompts: list[str]) -> RewardOutput:
        with self.lock:
            self.threads.add(threading.current_thread().name)
        if prompts and prompts[0] == "raise":
            raise ValueError("caller bug")
        time.sleep(self.delay + (0.05 if prompts and prompts[0] == "slow" else 0.0))
        avg = images.reshape(len(images), -1).mean(axis=1).astype(np.float32) / 255
        return RewardOutput(avg, {"slow_mean": avg.copy()}, 0, {"prompts": list(prompts)})


def images_with_means(*values: int) -> np.ndarray:
    return np.stack([np.full((8, 8, 3), v, np.uint8) for v in values])


def test_results_match_their_submission() -> None:
    reward = SlowMean()
    with AsyncRewardScorer(reward, num_workers=2) as scorer:
        slow = scorer.submit(images_with_means(255, 0), ["slow", "a"])
        fast = scorer.submit(images_with_means(51), ["b"])
        assert fast.result(timeout=5).avg.tolist() == pytest.approx([0.2])
        assert slow.result(timeout=5).avg.tolist() == [1.0, 0.0]
        assert slow.result().extra["prompts"] == ["slow", "a"]


def test_slices_run_on_separate_workers_and_are_rejoined_in_order() -> None:
    reward = SlowMean()
    reward.delay = 0.05  # keeps each worker busy, so the slices cannot all run on one thread
    values = list(range(0, 250, 25))
    bounds = [(0, 4), (4, 7), (7, 10)]  # as the driver cuts them (rlrunner.step.shares.reward_slices)
    with AsyncRewardScorer(reward, num_workers=3) as scorer:
        out = scorer.submit_all([(images_with_means(*values[a:b]), [f"p{i}" for i in range(a, b)])
                                 for a, b in bounds]).result(timeout=5)
        whole = scorer.submit(images_with_means(*values), ["x"] * len(values)).result(timeout=5)
    np.testing.assert_allclose(out.avg, np.array(values) / 255, rtol=1e-6)
    assert out.extra["prompts"] == [f"p{i}" for i in range(len(values))]
    assert len(reward.threads) >= 2
    np.testing.assert_array_equal(whole.avg, out.avg)  # one batch is one task: the scorer never splits it


def test_exceptions_reach_the_future_and_inputs_are_copied() -> None:
    with AsyncRewardScorer(SlowMean()) as scorer:
        with pytest.raises(ValueError, match="caller bug"):
            scorer.submit(images_with_means(1), ["raise"]).result(timeout=5)
        images = images_with_means(255)
        future = scorer.submit(images, ["slow"])
        images[:] = 0  # the caller reuses its buffer right away
        assert future.result(timeout=5).avg.tolist() == [1.0]
        with pytest.raises(ValueError, match="prompts"):
            scorer.submit(images, ["a", "b"])
    with pytest.raises(RuntimeError, match="closed"):
        scorer.submit(images, ["a"])


def test_parallel_workers_use_separate_engines(fake_engine, monkeypatch) -> None:
    """A job's two slices score at the same time, each on its own engine: every engine call waits at a barrier for
    the other one, so one worker (or one shared engine used in turn) would break the barrier and score 0."""
    barrier, users, read = threading.Barrier(2, timeout=5), [], fake_engine.read

    def read_together(self, images):
        users.append(id(self))
        barrier.wait()
        return read(self, images)

    monkeypatch.setattr(fake_engine, "read", read_together)
    reward = build_reward({"model": "ocr", "engine": "fake", "num_workers": 2})
    images = np.stack([coded_image(1, 16, seed=i) for i in range(6)])
    with AsyncRewardScorer(reward, num_workers=2) as scorer:
        outs = [scorer.submit_all([(images[:3], ['"hello world"'] * 3), (images[3:], ['"hello world"'] * 3)])
                for _ in range(2)]  # 2 slices each
        assert all(o.result(timeout=10).avg.tolist() == [1.0] * 6 for o in outs)
    assert len(users) == 4 and len(set(users)) == 2 and users[0] != users[1]
    assert len(reward.engines._free) == 2
