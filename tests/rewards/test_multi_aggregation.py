"""``type: multi`` aggregation modes and optional parts, with cheap pixel rewards and a reward that fails on purpose."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlrunner.algorithms.advantages import per_reward_normalized_advantages
from rlrunner.rewards import REWARDS, Reward, RewardOutput, build_reward


class Broken(Reward):
    """A reward whose model is down: every call raises."""

    name = "broken"

    def __call__(self, images, prompts) -> RewardOutput:
        raise RuntimeError("scorer crashed")


@pytest.fixture
def broken(monkeypatch):
    monkeypatch.setitem(REWARDS, "broken", Broken)


def pictures(n: int) -> np.ndarray:
    """Half flat, half noise: image_stats and jpeg_compressibility disagree in every group."""
    rng = np.random.default_rng(0)
    out = np.full((n, 32, 32, 3), 120, np.uint8)
    out[1::2] = rng.integers(0, 255, (n // 2, 32, 32, 3), dtype=np.uint8)
    return out


PARTS = [{"model": "image_stats", "weight": 1.0}, {"model": "jpeg_compressibility", "weight": 2.0}]


def test_weighted_sum_keeps_the_weighted_mean_and_hands_no_parts():
    out = build_reward({"type": "multi", "rewards": PARTS})(pictures(4), ["p"] * 4)
    expected = (out.parts["image_stats"] + 2 * out.parts["jpeg_compressibility"]) / 3
    np.testing.assert_allclose(out.avg, expected, rtol=1e-6)
    assert "part_scores" not in out.extra


def test_per_reward_normalized_hands_raw_parts_and_weights_to_gdpo():
    reward = build_reward({"type": "multi", "aggregation": "per_reward_normalized", "rewards": PARTS})
    out = RewardOutput.concat([reward(pictures(4), ["p"] * 4), reward(pictures(4), ["q"] * 4)])  # two env slices
    assert out.extra["part_scores"].shape == (8, 2) and out.extra["part_weights"].shape == (8, 2)
    np.testing.assert_allclose(out.extra["part_scores"][:, 1], out.parts["jpeg_compressibility"])
    np.testing.assert_allclose(out.extra["part_weights"], [[1.0, 2.0]] * 8)
    adv = per_reward_normalized_advantages(torch.from_numpy(out.extra["part_scores"]),
                                           torch.from_numpy(out.extra["part_weights"]), 2)
    assert adv.shape == (8,) and float(adv.std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)


def test_an_optional_part_that_fails_is_dropped_and_counted(broken):
    reward = build_reward({"type": "multi", "rewards": [*PARTS, {"model": "broken", "weight": 5.0,
                                                                  "required": False}]})
    out = reward(pictures(4), ["p"] * 4)
    expected = (out.parts["image_stats"] + 2 * out.parts["jpeg_compressibility"]) / 3  # as if it were not there
    np.testing.assert_allclose(out.avg, expected, rtol=1e-6)
    np.testing.assert_allclose(out.parts["broken_dropped"], [1.0] * 4)
    assert "broken" not in out.parts and not out.failure
    gdpo = build_reward({"type": "multi", "aggregation": "per_reward_normalized",
                         "rewards": [*PARTS, {"model": "broken", "required": False}]})(pictures(2), ["p"] * 2)
    np.testing.assert_allclose(gdpo.extra["part_weights"], [[1.0, 2.0, 0.0]] * 2)


def test_a_required_part_that_fails_stops_the_batch(broken):
    with pytest.raises(RuntimeError, match="scorer crashed"):
        build_reward({"type": "multi", "rewards": [*PARTS, {"model": "broken"}]})(pictures(2), ["p"] * 2)
    with pytest.raises(ValueError, match="Unknown reward.aggregation 'mean'"):
        build_reward({"type": "multi", "aggregation": "mean", "rewards": PARTS})
