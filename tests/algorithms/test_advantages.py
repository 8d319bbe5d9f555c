"""Group advantages against hand-computed values."""

import pytest
import torch

from rlrunner.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    estimate_advantages,
    get_advantage_estimator,
    group_advantages,
    video_group_advantages,
)

S = (2 / 3) ** 0.5  # population std of [1, 2, 3]


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "std, expected",
    [
        ("group", [-1 / S, 0.0, 1 / S, 0.0, 0.0, 0.0]),
        # batch [1, 2, 3, 5, 5, 5]: mean 3.5, population variance 15.5/6
        ("global", [-1 / (15.5 / 6) ** 0.5, 0.0, 1 / (15.5 / 6) ** 0.5, 0.0, 0.0, 0.0]),
        ("none", [-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]),
    ],
)
def test_group_advantages(std, expected):
    rewards = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    close(group_advantages(rewards, 3, std=std, eps=0.0), expected)


def test_eps_is_added_to_std():
    close(group_advantages(torch.tensor([0.0, 2.0]), 2, eps=1.0), [-0.5, 0.5])  # std 1 -> divide by 2


@pytest.mark.parametrize("std", ["group", "global", "none"])
def test_constant_groups_get_zero(std):
    # 0.1 is not exact in binary: the group mean differs from the rewards by round-off
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7], dtype=torch.float32)
    adv = group_advantages(rewards, 3, std=std)
    assert torch.equal(adv, torch.zeros(6))


def test_video_mode_normalises_all_chunks_of_a_group_jointly():
    # one group of 2 rollouts x 2 chunks: [[0, 1], [2, 3]], mean 1.5, population std sqrt(1.25)
    chunk_rewards = torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 4.0], [4.0, 4.0]])
    k = 1.25**0.5
    close(
        video_group_advantages(chunk_rewards, 2, mode="video", eps=0.0),
        [[-1.5 / k, -0.5 / k], [0.5 / k, 1.5 / k], [0.0, 0.0], [0.0, 0.0]],
    )


def test_frame_mode_normalises_each_chunk_index():
    # chunk 0 over the group: [0, 2] -> [-1, 1]; chunk 1: [1, 5] -> [-1, 1]; chunk 2 constant -> 0
    chunk_rewards = torch.tensor([[0.0, 1.0, 0.3], [2.0, 5.0, 0.3]])
    close(video_group_advantages(chunk_rewards, 2, mode="frame", eps=0.0), [[-1.0, -1.0, 0.0], [1.0, 1.0, 0.0]])


def test_video_all_equal_is_zero_not_nan():
    adv = video_group_advantages(torch.full((4, 3), 0.3), 2)
    assert torch.equal(adv, torch.zeros(4, 3))


def test_errors():
    with pytest.raises(ValueError, match="multiple of group_size=4"):
        group_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="'batch'.*global"):
        group_advantages(torch.zeros(6), 3, std="batch")
    with pytest.raises(ValueError, match="'chunk'.*frame"):
        video_group_advantages(torch.zeros(4, 2), 2, mode="chunk")
    with pytest.raises(ValueError, match=r"\[B, K\]"):
        video_group_advantages(torch.zeros(4), 2)
    with pytest.raises(ValueError, match="'ppo'.*grpo_video"):
        get_advantage_estimator("ppo")
    assert get_advantage_estimator("grpo_video") is video_group_advantages


def test_advantage_mode_reaches_each_estimator_under_its_own_keyword():
    """algorithm.advantage_mode is ``std`` for grpo and ``mode`` for grpo_video; the estimators' table says which."""
    rewards = torch.tensor([1.0, 3.0, 2.0, 6.0])
    assert torch.equal(estimate_advantages("grpo", rewards, 2, "none"), group_advantages(rewards, 2, std="none"))
    assert not torch.equal(estimate_advantages("grpo", rewards, 2, "none"), group_advantages(rewards, 2))
    chunks = torch.tensor([[1.0, 2.0], [3.0, 7.0], [0.0, 1.0], [2.0, 2.0]])
    assert torch.equal(estimate_advantages("grpo_video", chunks, 2, "frame"),
                       video_group_advantages(chunks, 2, mode="frame"))
    assert not torch.equal(estimate_advantages("grpo_video", chunks, 2, "frame"), video_group_advantages(chunks, 2))
    assert {name: e.modes for name, e in ADVANTAGE_ESTIMATORS.items()} == {
        "grpo": ("group", "global", "none"), "grpo_video": ("video", "frame")}


# ------------------------------------------------------------------------- several rewards (GDPO-style)


def test_per_reward_normalized_hand_computed():
    from rlrunner.algorithms.advantages import per_reward_normalized_advantages

    # groups of 2; reward 1 is constant in group 2 (z = 0 there, never NaN)
    parts = torch.tensor([[1.0, 10.0], [3.0, 0.0], [5.0, 2.0], [5.0, 4.0]])
    # z1 = [-1, 1, 0, 0], z2 = [1, -1, -1, 1]; s = z1 + 2 z2 = [1, -1, -2, 2]: mean 0, population std sqrt(2.5)
    adv = per_reward_normalized_advantages(parts, torch.tensor([1.0, 2.0]), 2, eps=0.0)
    close(adv, [v / 2.5**0.5 for v in (1.0, -1.0, -2.0, 2.0)])
    # the raw weighted sum ranks group 2 the other way round for nothing: r1 + 2 r2 = [21, 3, 9, 13]
    close(group_advantages(parts @ torch.tensor([1.0, 2.0]), 2, eps=0.0), [1.0, -1.0, -1.0, 1.0])


def test_per_reward_normalized_zero_std_and_row_weights():
    from rlrunner.algorithms.advantages import per_reward_normalized_advantages

    constant = torch.tensor([[1.0, 7.0], [1.0, 7.0], [2.0, 7.0], [2.0, 7.0]])
    close(per_reward_normalized_advantages(constant, torch.tensor([1.0, 1.0]), 2), [0.0] * 4)
    parts = torch.tensor([[1.0, 10.0], [3.0, 0.0], [5.0, 2.0], [5.0, 4.0]])
    # reward 2 dropped for the second group's rows: s = [-1 + 1, 1 - 1, 0, 0] -> all 0
    rows = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    close(per_reward_normalized_advantages(parts, rows, 2), [0.0] * 4)


def test_per_reward_normalized_video_chunks():
    from rlrunner.algorithms.advantages import per_reward_normalized_advantages

    chunks = torch.tensor([[[0.0, 1.0]], [[2.0, 3.0]]])  # [N=2, P=1, K=2], one group
    # video mode: the group's 4 chunk rewards jointly: z = (x − 1.5) / sqrt(1.25); the batch normalisation keeps it
    expected = [[(v - 1.5) / 1.25**0.5 for v in row] for row in ([0.0, 1.0], [2.0, 3.0])]
    close(per_reward_normalized_advantages(chunks, torch.tensor([3.0]), 2, eps=0.0), expected)
