"""awm_loss and the AWM timestep band against hand-computed values, the gradient's direction, and bad inputs."""

import math

import pytest
import torch

from rlrunner.algorithms.awm_loss import WEIGHTINGS, awm_band_index, awm_loss

C = 5.0  # adv_clip_max: Â = clamp(A, -5, 5) / 5


def image(rows, grad: bool = False) -> torch.Tensor:
    """[[a, b], ...] -> [B, 1, 1, 2]."""
    return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), 1, 1, 2).requires_grad_(grad)


# ---------------------------------------------------------------- hand-computed cases
# Two samples of two latent elements each; target u = ε - x0.
#   sample 0: x0 = [0, 0], ε = [1, 1] -> u = [1, 1];   v_θ = [1.5, 0.5] -> v_θ - u = [0.5, -0.5], ℓ0 = 0.25
#             t0 = 0.5, A0 = 2.5 -> Â0 = 0.5
#   sample 1: x0 = [1, 0], ε = [0, 2] -> u = [-1, 2];  v_θ = [1, 4]     -> v_θ - u = [2, 2],     ℓ1 = 4
#             t1 = 0.25, A1 = -10 -> clipped to -5 -> Â1 = -1
# L = (Â0·w0 + Â1·w1) / 2 with
#   none:   w = (0.25, 4)                              L = (0.125 - 4) / 2          = -1.9375
#   t:      w = (0.125, 1)                             L = (0.0625 - 1) / 2         = -0.46875
#   t2:     w = (0.0625, 0.25)                         L = (0.03125 - 0.25) / 2     = -0.109375
#   huber:  w = (0.5·(0.5 - d), 0.25·(2 - d)), d = √δ  L = (0.125 - 0.5) / 2        = -0.1875   (the d terms cancel)
#   ghuber: w = (2·(0.25^¼ - e), 4^¼ - e), e = δ^¼     L = (√½ - √2) / 2 = -√2/4   = -0.35355  (the e terms cancel)
HAND = {"none": -1.9375, "t": -0.46875, "t2": -0.109375, "huber": -0.1875, "ghuber": -math.sqrt(2) / 4}


def case(grad: bool = True) -> dict:
    return {
        "v_theta": image([[1.5, 0.5], [1.0, 4.0]], grad=grad),
        "x0": image([[0.0, 0.0], [1.0, 0.0]]),
        "noise": image([[1.0, 1.0], [0.0, 2.0]]),
        "t": torch.tensor([0.5, 0.25]),
        "adv": torch.tensor([2.5, -10.0]),
    }


@pytest.mark.parametrize("weighting", sorted(HAND))
def test_hand_values_of_each_weighting(weighting):
    loss, m = awm_loss(**case(), weighting=weighting, adv_clip_max=C)
    assert loss.item() == pytest.approx(HAND[weighting], abs=1e-6)
    assert m["awm_loss"] == pytest.approx(HAND[weighting], abs=1e-6)
    assert m["fm_loss"] == pytest.approx((0.25 + 4) / 2)
    assert m["kl"] == 0.0 and m["ema_kl"] == 0.0
    assert set(WEIGHTINGS) == set(HAND)


def test_hand_gradient_without_weighting():
    # dℓ/dv_θ = 2·(v_θ - u)/2 = v_θ - u, so dL/dv_θ = Â·(v_θ - u) / B:
    #   sample 0: 0.5·[0.5, -0.5]/2 = [0.125, -0.125];  sample 1: -1·[2, 2]/2 = [-1, -1]
    inputs = case()
    awm_loss(**inputs, weighting="none", adv_clip_max=C)[0].backward()
    torch.testing.assert_close(inputs["v_theta"].grad.reshape(2, 2), torch.tensor([[0.125, -0.125], [-1.0, -1.0]]))


def test_ghuber_at_power_one_half_is_twice_huber():
    ghuber, _ = awm_loss(**case(), weighting="ghuber", ghuber_power=0.5, adv_clip_max=C)
    huber, _ = awm_loss(**case(), weighting="huber", adv_clip_max=C)
    assert ghuber.item() == pytest.approx(2 * huber.item(), abs=1e-6)


@pytest.mark.parametrize("weighting", sorted(HAND))
def test_a_gradient_step_fits_positive_samples_and_pushes_negative_ones_away(weighting):
    """Â > 0: one small descent step moves v_θ toward ε - x0; Â < 0: away from it (every w grows with ℓ)."""
    inputs = case()
    awm_loss(**inputs, weighting=weighting, adv_clip_max=C)[0].backward()
    target = inputs["noise"] - inputs["x0"]

    def distance(v: torch.Tensor) -> torch.Tensor:
        return (v - target).square().flatten(1).sum(1)

    before = distance(inputs["v_theta"].detach())
    after = distance(inputs["v_theta"].detach() - 1e-2 * inputs["v_theta"].grad)
    assert after[0] < before[0]  # Â0 = 0.5
    assert after[1] > before[1]  # Â1 = -1


def test_zero_advantages_give_zero_gradient():
    inputs = case()
    inputs["adv"] = torch.zeros(2)
    loss, m = awm_loss(**inputs, weighting="ghuber", adv_clip_max=C)
    loss.backward()
    assert loss.item() == 0.0 and m["fm_loss"] > 0
    assert torch.count_nonzero(inputs["v_theta"].grad) == 0


def test_kl_and_ema_anchors_by_hand():
    # v_θ - v_ref = [[1, 1], [0, 2]]: squares 1, 1, 0, 4 -> kl = 1.5;  v_θ - v_ema = [[0, 0], [0, 1]] -> ema_kl = 0.25
    # loss = L_none + 0.1·1.5 + 2·0.25 = -1.9375 + 0.15 + 0.5
    # extra gradient: 2·0.1·[[1, 1], [0, 2]]/4 + 2·2·[[0, 0], [0, 1]]/4 = [[0.05, 0.05], [0, 0.1 + 1]]
    inputs = case()
    v_theta = inputs["v_theta"].detach()
    v_ref = v_theta - image([[1.0, 1.0], [0.0, 2.0]])
    v_ema = v_theta - image([[0.0, 0.0], [0.0, 1.0]])
    loss, m = awm_loss(**inputs, weighting="none", adv_clip_max=C, v_ref=v_ref, kl_coef=0.1, v_ema=v_ema,
                       ema_kl_coef=2.0)
    loss.backward()
    assert loss.item() == pytest.approx(-1.9375 + 0.15 + 0.5)
    assert m["awm_loss"] == pytest.approx(-1.9375) and m["kl"] == pytest.approx(1.5)
    assert m["ema_kl"] == pytest.approx(0.25)
    expected = torch.tensor([[0.125, -0.125], [-1.0, -1.0]]) + torch.tensor([[0.05, 0.05], [0.0, 1.1]])
    torch.testing.assert_close(inputs["v_theta"].grad.reshape(2, 2), expected)


def test_anchor_metrics_are_logged_without_their_coefficient():
    inputs = case()
    v_ref = inputs["v_theta"].detach() - 1.0
    loss, m = awm_loss(**inputs, adv_clip_max=C, v_ref=v_ref)
    assert m["kl"] == pytest.approx(1.0) and loss.item() == pytest.approx(HAND["none"])


def test_per_frame_advantages_weight_each_latent_frame():
    # one video sample [1, C=1, F=2, 1, 1]: v_θ - u = [1, 3] per frame -> ℓ = [1, 9]; A = [1, -2] -> Â = [0.2, -0.4]
    # weighting t with t = 0.5: w = [0.5, 4.5] -> L = (0.1 - 1.8) / 2 = -0.85
    # one advantage for the sample, A = 1: ℓ = 5, w = 2.5, L = 0.2·2.5 = 0.5
    x0 = torch.zeros(1, 1, 2, 1, 1)
    noise = torch.zeros(1, 1, 2, 1, 1)
    v_theta = torch.tensor([1.0, 3.0]).reshape(1, 1, 2, 1, 1)
    t = torch.tensor([0.5])
    per_frame, _ = awm_loss(v_theta, x0, noise, t, torch.tensor([[1.0, -2.0]]), weighting="t", adv_clip_max=C)
    per_sample, _ = awm_loss(v_theta, x0, noise, t, torch.tensor([1.0]), weighting="t", adv_clip_max=C)
    assert per_frame.item() == pytest.approx(-0.85)
    assert per_sample.item() == pytest.approx(0.5)


def test_low_precision_velocities_are_upcast():
    inputs = case(grad=False)
    loss, _ = awm_loss(**{**inputs, "v_theta": inputs["v_theta"].bfloat16()}, adv_clip_max=C)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(HAND["none"])


@pytest.mark.parametrize(("change", "message"), [
    ({"weighting": "tt"}, r"unknown weighting 'tt'; valid: \['ghuber', 'huber', 'none', 't', 't2'\]"),
    ({"noise": torch.zeros(2, 1, 1, 3)}, r"noise has shape \(2, 1, 1, 3\), expected x0's shape \(2, 1, 1, 2\)"),
    ({"t": torch.ones(2, 1)}, r"t has shape \(2, 1\), expected \[B\] = \(2,\)"),
    ({"adv": torch.ones(3)}, r"adv has shape \(3,\), expected \[B\] = \(2,\) or \[B, F\] for video"),
    ({"adv": torch.ones(2, 2)}, r"per-frame adv of shape \(2, 2\) needs video latents \[B, C, F, H, W\]"),
    ({"kl_coef": 0.1}, r"kl_coef=0.1 needs v_ref; got v_ref=None"),
    ({"ema_kl_coef": 1.0}, r"ema_kl_coef=1.0 needs v_ema; got v_ema=None"),
    ({"kl_coef": -1.0}, r"kl_coef must be >= 0, got -1.0"),
    ({"adv_clip_max": 0.0}, r"adv_clip_max must be > 0, got 0.0"),
    ({"ghuber_power": 0.0}, r"ghuber_power must be > 0, got 0.0"),
])
def test_bad_inputs_name_the_argument(change, message):
    with pytest.raises(ValueError, match=message):
        awm_loss(**{**case(grad=False), **change})


# ---------------------------------------------------------------- the timestep band
def test_band_strata_by_hand():
    # N = 10, fraction 0.9 -> K = 9; 6 draws: bounds = linspace(1, 9, 7) = [1, 2.33, 3.67, 5, 6.33, 7.67, 9]
    # truncated to [1, 2, 3, 5, 6, 7, 9]: strata {1}, {2}, {3, 4}, {5}, {6}, {7, 8}
    u = torch.tensor([0.0, 0.49, 0.5, 0.99])
    expected = [[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 4, 4], [5, 5, 5, 5], [6, 6, 6, 6], [7, 7, 8, 8]]
    for draw, ks in enumerate(expected):
        assert awm_band_index(u, 10, 0.9, draw, 6).tolist() == ks


def test_band_of_the_official_recipe_skips_pure_noise_and_the_last_steps():
    # SD3 recipes: 14 steps, fraction 0.9, 6 draws -> K = 12, strata {1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}
    u = torch.linspace(0, 0.999, 50)
    seen = {k for draw in range(6) for k in awm_band_index(u, 14, 0.9, draw, 6).tolist()}
    assert seen == set(range(1, 12))
    assert awm_band_index(torch.tensor([0.99]), 14, 0.9, 5, 6).tolist() == [11]


def test_band_with_one_index_uses_it_for_every_draw():
    # 2 steps, fraction 0.9 -> K = 1: every draw trains at σ_1 (as the official code does)
    u = torch.tensor([0.0, 0.7])
    assert [awm_band_index(u, 2, 0.9, d, 3).tolist() for d in range(3)] == [[1, 1]] * 3


@pytest.mark.parametrize(("args", "message"), [
    ((1, 1.0, 0, 1), r"needs num_steps >= 2 and int\(num_steps \* fraction\) >= 1; got num_steps=1, fraction=1.0"),
    ((10, 0.05, 0, 1), r"got num_steps=10, fraction=0.05"),
    ((10, 0.9, 3, 3), r"draw=3 is outside \[0, draws=3\)"),
])
def test_band_rejects_empty_bands_and_bad_draws(args, message):
    with pytest.raises(ValueError, match=message):
        awm_band_index(torch.zeros(1), *args)
