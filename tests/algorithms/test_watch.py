"""The reward-hacking watch's math: diversity by hand-computed values, and the alarm rule on hand-made histories
(a hacked run's, and noise that must not fire it)."""

import math

import pytest
import torch

from rlrunner.algorithms.watch import (
    AlarmRule,
    across_prompt_diversity,
    diversity,
    pairwise_distances,
    sample_features,
    within_group_diversity,
)


def _images(*values: int, h: int = 4, w: int = 6) -> torch.Tensor:
    """uint8 [B, h, w, 3] images, each of one grey level."""
    return torch.tensor(values, dtype=torch.uint8)[:, None, None, None].expand(-1, h, w, 3).contiguous()


def test_features_average_the_pixels_of_each_cell_in_unit_range():
    checker = torch.tensor([[0, 255], [255, 0]], dtype=torch.uint8)[None, :, :, None].expand(1, 2, 2, 3)
    assert torch.allclose(sample_features(checker, size=1), torch.full((1, 3), 0.5))
    features = sample_features(_images(0, 255))
    assert features.shape == (2, 16 * 16 * 3)
    assert features[0].abs().max() == 0 and torch.all(features[1] == 1)


def test_video_features_take_four_evenly_spaced_frames():
    frames = torch.arange(9, dtype=torch.float32)[None, :, None, None, None].expand(1, 9, 2, 2, 3) / 8
    features = sample_features(frames, size=1).reshape(4, 3)
    assert torch.allclose(features[:, 0], torch.tensor([0, 3, 5, 8]) / 8)  # frames 0, 2.67 -> 3, 5.33 -> 5, 8


def test_black_and_white_are_one_apart_and_identical_samples_zero():
    features = sample_features(_images(0, 255, 255))
    assert torch.allclose(pairwise_distances(features), torch.tensor([[0.0, 1, 1], [1, 0, 0], [1, 0, 0]],
                                                                     dtype=torch.float64))
    same = sample_features(_images(*[128] * 8))
    assert within_group_diversity(same, 4) == 0 and across_prompt_diversity(same) == 0 and diversity(same, 1) == 0


def test_within_group_diversity_by_hand():
    # one-number features: group (0, 0.5, 1) has pairs 0.5, 1, 0.5 -> 2/3; group (0.2, 0.2, 0.2) -> 0
    features = torch.tensor([[0.0], [0.5], [1.0], [0.2], [0.2], [0.2]])
    assert within_group_diversity(features, 3) == pytest.approx((2 / 3 + 0) / 2)
    assert diversity(features, 3) == pytest.approx(1 / 3)  # groups of >= 2: within


def test_across_prompt_diversity_by_hand():
    a, b, c = [0.0, 0, 0, 0], [1.0, 1, 0, 0], [1.0, 1, 1, 1]  # rms distances: a-b sqrt(2/4), a-c 1, b-c sqrt(2/4)
    assert across_prompt_diversity(torch.tensor([a, b, c])) == pytest.approx((2 * math.sqrt(0.5) + 1) / 3)
    # two prompts, each drawing one image twice: nothing varies within a prompt, everything across
    pairs = torch.tensor([[0.0], [0.0], [1.0], [1.0]])
    assert within_group_diversity(pairs, 2) == 0 and across_prompt_diversity(pairs, 2) == 1


def test_diversity_refuses_groups_it_cannot_measure():
    with pytest.raises(ValueError, match="group_size=1"):
        within_group_diversity(torch.zeros(4, 2), 1)
    with pytest.raises(ValueError, match="2 prompts"):
        across_prompt_diversity(torch.zeros(1, 2))


RULE = AlarmRule(max_drop=0.5, min_reward_rise=0.05, window=5)


def test_the_hacked_run_fires():
    """The issue's run: training reward 0.44 -> 0.83 while the held-out OCR fell 0.759 -> 0.022 by step 10."""
    train = [0.44 + 0.039 * step for step in range(10)]
    assert not RULE.fires(train[:5], [0.759, 0.70])  # the guard has not fallen far yet
    assert RULE.fires(train, [0.759, 0.30, 0.022])
    assert RULE.guard_drop([0.759, 0.022]) == pytest.approx((0.759 - 0.022) / 0.759)


def test_noise_does_not_fire():
    generator = torch.Generator().manual_seed(0)
    # an honest run: the reward rises with step-to-step noise, the guard jitters +-0.03 around 0.75 at each eval
    train = (0.5 + 0.005 * torch.arange(40) + 0.05 * torch.randn(40, generator=generator)).tolist()
    guard = (0.75 + 0.03 * torch.randn(9, generator=generator)).tolist()
    assert RULE.reward_rise(train) > RULE.min_reward_rise
    assert not any(RULE.fires(train[:5 * (k + 1)], guard[:k + 1]) for k in range(9))
    # a single bad eval that dips 40% is not past max_drop either
    assert not RULE.fires(train, [0.75, 0.76, 0.45])


def test_a_guard_that_falls_with_the_training_reward_is_a_failing_run_not_a_hacked_one():
    falling = [0.6 - 0.01 * step for step in range(20)]
    assert RULE.reward_rise(falling) < 0 and not RULE.fires(falling, [0.75, 0.1])
    flat = [0.5, 0.6] * 10  # noisy but flat: the means of its first and last 5 steps differ by 0.02
    assert not RULE.fires(flat, [0.75, 0.1])


def test_a_guard_without_a_second_value_or_from_zero_cannot_fall():
    assert RULE.guard_drop([0.7]) == 0 and RULE.guard_drop([0.0, -1.0]) == 0 and RULE.reward_rise([]) == 0
    assert RULE.guard_drop([-2.0, -3.0]) == pytest.approx(0.5)  # a negative score falls by its magnitude
