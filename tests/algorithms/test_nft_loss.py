"""nft_loss against hand-computed values, a per-sample reference written from docs/design.md
("The NFT loss"), and the facts listed there."""

import pytest
import torch

from rlrunner.algorithms.nft_loss import nft_loss, nft_velocities, reward_weight

BETA, C = 0.5, 5.0  # hand cases: t·β = 0.25 and c/β = 10


def leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def image(rows) -> torch.Tensor:
    """[[a, b], ...] -> [B, 1, 1, 2]."""
    return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), 1, 1, 2)


# ---------------------------------------------------------------- hand-computed cases
# One sample, two latent elements: x_t = [1, 1], t = 0.5, x0 = [0.25, 0], v_old = [2, 1], v_θ = [3, 1].
#   Δv = [1, 0];  v+ = [2.5, 1], v- = [1.5, 1];  x̂0+ = [-0.25, 0.5], x̂0- = [0.25, 0.5]
#   err+ = [-0.5, 0.5], err- = [0, 0.5]
#   constant: E+ = 0.25, E- = 0.125;  adaptive: w+ = 1/0.5, w- = 1/0.25 -> E+ = 0.5, E- = 0.5
#   adv = 2.5 -> r = (2.5 + 5)/10 = 0.75
#   constant: L = (0.75·0.25 + 0.25·0.125)·10 = 2.1875;  adaptive: L = (0.75·0.5 + 0.25·0.5)·10 = 5.0
#   constant gradient: dE+/dv_θ = 2·err+·(-tβ)/2 = [0.125, -0.125]; dE-/dv_θ = 2·err-·(tβ)/2 = [0, 0.125]
#                      dL/dv_θ = 10·(0.75·[0.125, -0.125] + 0.25·[0, 0.125]) = [0.9375, -0.625]
def case1():
    return {
        "v_theta": leaf([[3.0, 1.0]]).reshape(1, 1, 1, 2),
        "v_old": image([[2.0, 1.0]]),
        "x_t": image([[1.0, 1.0]]),
        "x0": image([[0.25, 0.0]]),
        "t": torch.tensor([0.5]),
        "adv": torch.tensor([2.5]),
    }


def test_hand_constant_weights():
    inputs = case1()
    v_theta = inputs["v_theta"]
    v_theta.retain_grad()
    loss, m = nft_loss(**inputs, beta=BETA, adv_clip_max=C, weight_mode="constant")
    loss.backward()
    assert loss.item() == pytest.approx(2.1875)
    assert m["nft_loss"] == pytest.approx(2.1875)
    assert m["E_pos_mean"] == pytest.approx(0.25) and m["E_neg_mean"] == pytest.approx(0.125)
    assert m["delta_v_norm"] == pytest.approx(0.5**0.5)  # RMS of Δv = [1, 0]
    assert m["clip_frac"] == 0.0 and m["clip_loss_frac"] == 0.0 and m["kl"] == 0.0
    torch.testing.assert_close(v_theta.grad.reshape(2), torch.tensor([0.9375, -0.625]))


def test_hand_adaptive_weights():
    loss, m = nft_loss(**case1(), beta=BETA, adv_clip_max=C)
    assert loss.item() == pytest.approx(5.0)
    assert m["E_pos_mean"] == pytest.approx(0.5) and m["E_neg_mean"] == pytest.approx(0.5)


def test_advantage_is_clipped_to_c():
    # adv = 100 -> clamp to 5 -> r = 1: L = E+·10 = 2.5 (constant weights)
    inputs = case1() | {"adv": torch.tensor([100.0])}
    loss, _ = nft_loss(**inputs, beta=BETA, adv_clip_max=C, weight_mode="constant")
    assert loss.item() == pytest.approx(2.5)


# Clip case, constant weights, two samples with x_t = [1, 1], t = 0.5, x0 = [0.25, 1], v_old = [2, 0]:
#   x̂0_old = [0, 1], d = x̂0_old - x0 = [-0.25, 0]; err± = d ∓ a with a = tβ·Δv = 0.25·Δv; adv = 2.5 -> r = 0.75
#   L(a) = 10·(0.75·(-0.25 - a)²/2 + 0.25·(-0.25 + a)²/2)  (first element only; the second is 0)
#   ρ = 0.1: bound = 0.1·‖v_old‖ = 0.2
#   sample 0: Δv = [-0.4, 0] (binds, s = 0.5, Δv_c = [-0.2, 0]); a = -0.1, a_c = -0.05
#       L = 10·(0.75·0.0225 + 0.25·0.1225)/2 = 0.2375;  L_c = 10·(0.75·0.04 + 0.25·0.09)/2 = 0.2625 > L
#       -> L_c is taken and sample 0 gives no gradient (without clip: dL/dv_θ = 10·(0.75·0.15 - 0.25·0.35)·0.25 = 0.0625)
#   sample 1: Δv = [0.1, 0] (‖Δv‖ = 0.1 < 0.2: s = 1); a = 0.025
#       L = 10·(0.75·0.075625 + 0.25·0.050625)/2 = 0.346875;  dL/dv_θ = 10·(0.75·0.275 - 0.25·0.225)·0.25 = 0.375
#   batch mean: clip on  -> loss (0.2625 + 0.346875)/2 = 0.3046875, grad [[0, 0], [0.1875, 0]]
#               clip off -> loss (0.2375 + 0.346875)/2 = 0.2921875, grad [[0.03125, 0], [0.1875, 0]]
def clip_case():
    return {
        "v_theta": leaf([[1.6, 0.0], [2.1, 0.0]]),
        "v_old": image([[2.0, 0.0], [2.0, 0.0]]),
        "x_t": image([[1.0, 1.0], [1.0, 1.0]]),
        "x0": image([[0.25, 1.0], [0.25, 1.0]]),
        "t": torch.tensor([0.5, 0.5]),
        "adv": torch.tensor([2.5, 2.5]),
    }


@pytest.mark.parametrize(
    "clip_ratio, expected_loss, expected_grad, clip_frac, clip_loss_frac",
    [
        (0.1, 0.3046875, [[0.0, 0.0], [0.1875, 0.0]], 0.5, 0.5),
        (None, 0.2921875, [[0.03125, 0.0], [0.1875, 0.0]], 0.0, 0.0),
        (10.0, 0.2921875, [[0.03125, 0.0], [0.1875, 0.0]], 0.0, 0.0),  # loose region: never binds
    ],
)
def test_hand_clip(clip_ratio, expected_loss, expected_grad, clip_frac, clip_loss_frac):
    inputs = clip_case()
    v_theta_leaf = inputs["v_theta"]
    inputs["v_theta"] = v_theta_leaf.reshape(2, 1, 1, 2)
    loss, m = nft_loss(**inputs, beta=BETA, adv_clip_max=C, weight_mode="constant", clip_ratio=clip_ratio)
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss)
    torch.testing.assert_close(v_theta_leaf.grad, torch.tensor(expected_grad))
    assert m["clip_frac"] == clip_frac and m["clip_loss_frac"] == clip_loss_frac


def test_clip_with_unclipped_larger_keeps_gradient():
    # r = 0.25 (adv = -2.5) on sample 0 (Δv = [-0.4, 0], binds): L = 10·(0.25·0.0225 + 0.75·0.1225)/2 = 0.4875,
    # L_c = 10·(0.25·0.04 + 0.75·0.09)/2 = 0.3875 < L -> unclipped kept, dL/dv_θ = 10·(0.25·0.15 - 0.75·0.35)·0.25
    # = -0.5625 (batch of one)
    inputs = {k: v[:1] for k, v in clip_case().items()} | {"adv": torch.tensor([-2.5])}
    v_theta_leaf = leaf([[1.6, 0.0]])
    inputs["v_theta"] = v_theta_leaf.reshape(1, 1, 1, 2)
    loss, m = nft_loss(**inputs, beta=BETA, adv_clip_max=C, weight_mode="constant", clip_ratio=0.1)
    loss.backward()
    assert loss.item() == pytest.approx(0.4875)
    assert m["clip_frac"] == 1.0 and m["clip_loss_frac"] == 0.0
    torch.testing.assert_close(v_theta_leaf.grad, torch.tensor([[-0.5625, 0.0]]))


def test_hand_kl_anchor():
    # v_θ - v_base = [[-0.4, 0], [0.1, 0]] -> kl = (0.16 + 0.01)/4 = 0.0425; k = 2 adds 0.085 to the loss and
    # k·2·(v_θ - v_base)/4 = (v_θ - v_base) to the gradient.
    inputs = clip_case()
    v_theta_leaf = inputs["v_theta"]
    inputs["v_theta"] = v_theta_leaf.reshape(2, 1, 1, 2)
    v_base = image([[2.0, 0.0], [2.0, 0.0]])
    loss, m = nft_loss(**inputs, beta=BETA, adv_clip_max=C, weight_mode="constant", v_base=v_base, kl_coef=2.0)
    loss.backward()
    assert m["kl"] == pytest.approx(0.0425)
    assert m["nft_loss"] == pytest.approx(0.2921875)
    assert loss.item() == pytest.approx(0.2921875 + 0.085)
    torch.testing.assert_close(v_theta_leaf.grad, torch.tensor([[0.03125 - 0.4, 0.0], [0.1875 + 0.1, 0.0]]))


# Video, one sample, latents [1, 1, F=2, 1, 2], adv per latent frame [[2.5, -2.5]] -> r = [0.75, 0.25]:
#   frame 0 = case 1: constant L = 2.1875, adaptive L = 5.0
#   frame 1: x_t = [1, 1], x0 = [0.5, 0], v_old = [2, 1], v_θ = [4, 1]: Δv = [2, 0], a = tβΔv = [0.5, 0]
#       x̂0_old = [0, 0.5]; err+ = [-1, 0.5], err- = [0, 0.5]
#       constant: E+ = 0.625, E- = 0.125, L = (0.25·0.625 + 0.75·0.125)·10 = 2.5
#       adaptive (weights of frame 1 only): w+ = 1/0.75, w- = 1/0.25 -> E+ = 0.625/0.75, E- = 0.5,
#       L = (0.25·0.625/0.75 + 0.75·0.5)·10 = 5.8333…
#   mean over (sample, frame): constant 2.34375, adaptive 5.41666…
def video_case():
    def frames(f0, f1):
        return torch.tensor([f0, f1], dtype=torch.float32).reshape(1, 1, 2, 1, 2)

    return {
        "v_theta": frames([3.0, 1.0], [4.0, 1.0]),
        "v_old": frames([2.0, 1.0], [2.0, 1.0]),
        "x_t": frames([1.0, 1.0], [1.0, 1.0]),
        "x0": frames([0.25, 0.0], [0.5, 0.0]),
        "t": torch.tensor([0.5]),
        "adv": torch.tensor([[2.5, -2.5]]),
    }


@pytest.mark.parametrize("weight_mode, expected", [("constant", 2.34375), ("adaptive", (5.0 + 17.5 / 3) / 2)])
def test_hand_video_per_frame(weight_mode, expected):
    loss, _ = nft_loss(**video_case(), beta=BETA, adv_clip_max=C, weight_mode=weight_mode)
    assert loss.item() == pytest.approx(expected)


def test_video_per_sample_advantage_uses_whole_sample():
    # adv [B] on video latents: one energy over both frames. Constant weights, r = 0.75:
    # E+ = mean([0.25, 0.25, 1, 0.25]) = 0.4375, E- = mean([0, 0.25, 0, 0.25]) = 0.125
    # L = (0.75·0.4375 + 0.25·0.125)·10 = 3.59375
    inputs = video_case() | {"adv": torch.tensor([2.5])}
    loss, _ = nft_loss(**inputs, beta=BETA, adv_clip_max=C, weight_mode="constant")
    assert loss.item() == pytest.approx(3.59375)


# ---------------------------------------------------------------- reference from the formulas, random inputs
def reference_energy_loss(vt, vo, xt, x, t, r, dv, beta, c, weight_mode, w=None):
    """(r·E+ + (1 - r)·E-)·c/β for one (sample, frame) slice; returns the loss and the weights (w+, w-)."""
    err_pos = xt - t * (vo + beta * dv) - x
    err_neg = xt - t * (vo - beta * dv) - x
    if w is None:
        w = (1.0, 1.0)
        if weight_mode == "adaptive":
            w = (
                (1 / err_pos.abs().mean().clamp_min(1e-5)).detach(),
                (1 / err_neg.abs().mean().clamp_min(1e-5)).detach(),
            )
    return (r * (err_pos**2).mean() * w[0] + (1 - r) * (err_neg**2).mean() * w[1]) * c / beta, w


def reference_loss(v_theta, v_old, x_t, x0, t, adv, beta, c, weight_mode, clip_ratio, v_base, kl_coef):
    """Naive per-(sample, frame) loop over docs/design.md, "The NFT loss"."""
    per_frame = adv.dim() == 2
    terms = []
    for b in range(x0.shape[0]):
        for f in range(adv.shape[1] if per_frame else 1):
            vt, vo, xt, x = (z[b][:, f] if per_frame else z[b] for z in (v_theta, v_old, x_t, x0))
            r = ((adv[b, f] if per_frame else adv[b]).clamp(-c, c) + c) / (2 * c)
            dv = vt - vo
            loss, w = reference_energy_loss(vt, vo, xt, x, t[b], r, dv, beta, c, weight_mode)
            if clip_ratio is not None:
                s = min(1.0, (clip_ratio * vo.norm() / dv.norm()).item()) if dv.norm() > 0 else 1.0
                dv_c = (s * dv).detach() if s < 1 else dv
                loss_c, _ = reference_energy_loss(vt, vo, xt, x, t[b], r, dv_c, beta, c, weight_mode, w)
                loss = loss_c if loss_c > loss else loss  # noqa: FURB136 (ties keep the unclipped loss)
            terms.append(loss)
    total = torch.stack(terms).mean()
    if v_base is not None:
        total = total + kl_coef * ((v_theta - v_base) ** 2).mean()
    return total


@pytest.mark.parametrize("weight_mode", ["adaptive", "constant"])
@pytest.mark.parametrize("clip_ratio", [None, 0.05])
@pytest.mark.parametrize("video", [False, True])
def test_matches_reference(weight_mode, clip_ratio, video):
    g = torch.Generator().manual_seed(0)
    shape = (4, 3, 2, 4, 4) if video else (4, 3, 4, 4)

    def rand():
        return torch.randn(shape, generator=g)

    x0, noise, v_old, v_base = rand(), rand(), rand(), rand()
    t = torch.tensor([1.0, 0.75, 0.5, 0.25])
    x_t = (1 - t.reshape(-1, *[1] * (len(shape) - 1))) * x0 + t.reshape(-1, *[1] * (len(shape) - 1)) * noise
    adv = (
        torch.tensor([[3.0, -1.0], [-7.0, 0.5], [0.0, 6.0], [1.0, -2.0]])
        if video
        else torch.tensor([3.0, -7.0, 0.0, 6.0])
    )
    v_theta = (v_old + 0.1 * rand()).requires_grad_()
    kw = {"beta": 0.1, "weight_mode": weight_mode, "clip_ratio": clip_ratio}

    loss, m = nft_loss(v_theta, v_old, x_t, x0, t, adv, v_base=v_base, kl_coef=1e-2, **kw)
    (grad,) = torch.autograd.grad(loss, v_theta)
    ref = reference_loss(v_theta, v_old, x_t, x0, t, adv, 0.1, 5.0, weight_mode, clip_ratio, v_base, 1e-2)
    (ref_grad,) = torch.autograd.grad(ref, v_theta)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-7)
    if clip_ratio is not None:
        assert 0 < m["clip_frac"] <= 1  # ‖Δv‖/‖v_old‖ ≈ 0.1 > ρ = 0.05: the trust region binds
        assert 0 < m["clip_loss_frac"] < 1


def test_low_precision_inputs_compute_in_float32():
    inputs = {k: (v.detach().to(torch.bfloat16) if k != "t" and k != "adv" else v) for k, v in case1().items()}
    loss, _ = nft_loss(**inputs, beta=BETA, adv_clip_max=C, weight_mode="constant")
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(2.1875)


# ---------------------------------------------------------------- docs/design.md facts
def random_batch(seed=0, shape=(5, 2, 3, 3)):
    g = torch.Generator().manual_seed(seed)
    x0, noise, v_old = (torch.randn(shape, generator=g) for _ in range(3))
    t = torch.tensor([0.9, 0.7, 0.5, 0.3, 0.1])
    x_t = (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * noise
    return x0, x_t, v_old, t, g


def test_implicit_policies_average_to_old():
    _, _, v_old, _, g = random_batch()
    v_theta = torch.randn(v_old.shape, generator=g)
    v_pos, v_neg = nft_velocities(v_theta, v_old, beta=0.1)
    torch.testing.assert_close((v_pos + v_neg) / 2, v_old)
    torch.testing.assert_close(v_pos - v_neg, 0.2 * (v_theta - v_old))


def test_no_reward_signal_only_pulls_back_to_old():
    """r = 0.5, w = 1: L = c/β·mean_b(mean((x̂0_old - x0)²) + t²β²·mean(Δv²)), ∇_{v_θ} L = 2cβt²·Δv/(n·B)."""
    x0, x_t, v_old, t, g = random_batch()
    delta_v = torch.randn(v_old.shape, generator=g)
    v_theta = (v_old + delta_v).requires_grad_()
    beta, c, n, batch = 0.1, 5.0, x0[0].numel(), x0.shape[0]
    loss, _ = nft_loss(
        v_theta, v_old, x_t, x0, t, torch.zeros(batch), beta=beta, adv_clip_max=c, weight_mode="constant"
    )
    (grad,) = torch.autograd.grad(loss, v_theta)
    t_b = t[:, None, None, None]
    fm_error = (x_t - t_b * v_old - x0).square().mean(dim=(1, 2, 3))
    expected = (c / beta) * (fm_error + t**2 * beta**2 * delta_v.square().mean(dim=(1, 2, 3)))
    torch.testing.assert_close(loss, expected.mean())
    torch.testing.assert_close(grad, 2 * c * beta * t_b**2 * delta_v / (n * batch))
    assert (grad * delta_v).sum() > 0  # a descent step shrinks Δv: back toward v_old


@pytest.mark.parametrize("weight_mode", ["adaptive", "constant"])
def test_first_step_moves_x0_prediction_by_two_r_minus_one(weight_mode):
    """At θ = θ_old: ∇_{v_θ} L = 2c·t·w·(1 - 2r)·(x̂0_old - x0)/(n·B), so a step v_θ -= η∇ moves
    x̂0 = x_t - t·v_θ by -η·2c·t²·w·(2r - 1)·(x̂0_old - x0)/(n·B): toward x0 for r > 0.5, away for r < 0.5."""
    x0, x_t, v_old, t, _ = random_batch(seed=1)
    c, n, batch = 5.0, x0[0].numel(), x0.shape[0]
    adv = torch.tensor([5.0, 2.5, 0.0, -2.5, -5.0])  # r = 1, 0.75, 0.5, 0.25, 0
    r = (adv + c) / (2 * c)
    v_theta = v_old.clone().requires_grad_()
    loss, m = nft_loss(v_theta, v_old, x_t, x0, t, adv, beta=0.1, adv_clip_max=c, weight_mode=weight_mode)
    (grad,) = torch.autograd.grad(loss, v_theta)
    assert m["delta_v_norm"] == 0.0

    t_b = t[:, None, None, None]
    d = x_t - t_b * v_old - x0
    w = 1 / d.abs().mean(dim=(1, 2, 3)) if weight_mode == "adaptive" else torch.ones(batch)
    coef = (2 * c * t * w * (1 - 2 * r) / (n * batch))[:, None, None, None]
    torch.testing.assert_close(grad, coef * d)

    eta = 1e-2
    step = -t_b * (-eta * grad)  # change of x̂0 after v_θ -= η·∇
    kappa = (eta * 2 * c * t**2 * w / (n * batch))[:, None, None, None]
    torch.testing.assert_close(step, -kappa * (2 * r - 1)[:, None, None, None] * d)
    err_before = d.square().sum(dim=(1, 2, 3))
    err_after = (d + step).square().sum(dim=(1, 2, 3))
    assert torch.all(err_after[:2] < err_before[:2])  # r > 0.5: toward x0
    assert err_after[2] == err_before[2]  # r = 0.5: no move
    assert torch.all(err_after[3:] > err_before[3:])  # r < 0.5: away from x0
    # the move is proportional to (2r - 1): r = 0.75 moves half as far (relative to κ) as r = 1
    rel = (step.flatten(1).norm(dim=1) / (kappa.flatten() * d.flatten(1).norm(dim=1))).tolist()
    assert rel == pytest.approx([1.0, 0.5, 0.0, 0.5, 1.0], abs=1e-5)


# ---------------------------------------------------------------- input checks
def test_errors_name_the_bad_value():
    inputs = case1()
    with pytest.raises(ValueError, match="weight_mode 'foo'.*adaptive"):
        nft_loss(**inputs, beta=0.1, weight_mode="foo")
    with pytest.raises(ValueError, match="target_space 'eps'.*x0"):
        nft_loss(**inputs, beta=0.1, target_space="eps")
    with pytest.raises(ValueError, match=r"v_old has shape \(1, 1, 2, 1\)"):
        nft_loss(**(inputs | {"v_old": inputs["v_old"].reshape(1, 1, 2, 1)}), beta=0.1)
    with pytest.raises(ValueError, match=r"t has shape \(2,\)"):
        nft_loss(**(inputs | {"t": torch.ones(2)}), beta=0.1)
    with pytest.raises(ValueError, match="kl_coef"):
        nft_loss(**inputs, beta=0.1, kl_coef=1e-4)
    with pytest.raises(ValueError, match="beta"):
        nft_loss(**inputs, beta=0.0)
    video = video_case()
    with pytest.raises(ValueError, match=r"adv of shape \(1, 3\).*\(1, 1, 2, 1, 2\)"):
        nft_loss(**(video | {"adv": torch.zeros(1, 3)}), beta=0.1)
    with pytest.raises(ValueError, match=r"adv of shape \(1, 2\)"):
        nft_loss(**(inputs | {"adv": torch.zeros(1, 2)}), beta=0.1)  # per-frame adv on image latents


# ------------------------------------- what sets NFT's step (docs/algorithms/nft.md "What sets NFT's step size")
# At v_θ = v_old the c/β factor cancels β: the push is dL/dv_θ = -2·t·w·d·clamp(A, ±c) / (B·n) with
# d = x_t - t·v_old - x0, whatever β; β·c only sets the pull back, L(Δv) - L(0) - g·Δv = c·β·Σ t²·w·Δv² / (B·n).
def test_the_push_at_the_old_policy_does_not_depend_on_beta_and_the_pull_back_grows_with_beta_times_c():
    x_t, x0 = image([[1.0, 1.0], [0.0, 2.0]]), image([[0.25, 0.0], [0.5, 1.0]])
    v_old, t = image([[2.0, 1.0], [-1.0, 0.5]]), torch.tensor([0.5, 0.25])
    adv = torch.tensor([2.5, -7.0])  # the second is clipped to -c
    tb = t.reshape(2, 1, 1, 1)
    d = x_t - tb * v_old - x0  # [[0.25, 0.5], [-0.25, 0.875]]
    w = 1 / d.abs().mean(dim=(1, 2, 3), keepdim=True)
    push = -2 * tb * w * d * adv.clamp(-C, C).reshape(2, 1, 1, 1) / 4  # B·n = 2·2
    for beta in (1.0, 0.5, 0.1):
        v_theta = v_old.clone().requires_grad_(True)
        loss, _ = nft_loss(v_theta, v_old, x_t, x0, t, adv, beta=beta, adv_clip_max=C)
        (grad,) = torch.autograd.grad(loss, v_theta)
        torch.testing.assert_close(grad, push)
    step = image([[0.2, -0.4], [0.1, 0.3]])
    for beta, c in ((1.0, 5.0), (0.1, 5.0), (1.0, 1.0)):
        at = {s: nft_loss(v_old + s * step, v_old, x_t, x0, t, adv, beta=beta, adv_clip_max=c,
                          weight_mode="constant")[0] for s in (0.0, 1.0, -1.0)}
        curvature = (at[1.0] + at[-1.0]) / 2 - at[0.0]  # the quadratic term of L at Δv = step
        torch.testing.assert_close(curvature, c * beta * (tb**2 * step**2).sum() / 4)


# ---------------------------------------------------------------- advantage modes (algorithm.nft_adv_mode)
# adv = [-7, -2.5, 0, 2.5, 7] with c = 5 clips to a = [-5, -2.5, 0, 2.5, 5]; r = (m(a) + 5)/10
@pytest.mark.parametrize(
    "mode, expected_r",
    [
        ("all", [0.0, 0.25, 0.5, 0.75, 1.0]),
        ("positive_only", [0.5, 0.5, 0.5, 0.75, 1.0]),  # m(a) = [0, 0, 0, 2.5, 5]
        ("negative_only", [0.0, 0.25, 0.5, 0.5, 0.5]),  # m(a) = [-5, -2.5, 0, 0, 0]
        ("one_only", [0.5, 0.5, 0.5, 0.6, 0.6]),  # m(a) = [0, 0, 0, 1, 1]
        ("binary", [0.4, 0.4, 0.5, 0.6, 0.6]),  # m(a) = [-1, -1, 0, 1, 1]
    ],
)
def test_adv_modes_hand_values(mode, expected_r):
    r = reward_weight(torch.tensor([-7.0, -2.5, 0.0, 2.5, 7.0]), C, mode)
    torch.testing.assert_close(r, torch.tensor(expected_r))


def test_adv_modes_keep_r_in_0_1_and_enter_the_loss():
    # one_only with c = 0.5: m(a) = 1 > c gives (1 + 0.5)/1 = 1.5, clamped to 1 as the official code does
    assert reward_weight(torch.tensor([0.3, -0.3]), 0.5, "one_only").tolist() == [1.0, 0.5]
    # the loss sees only r: positive_only at adv -2.5 is the plain loss at adv 0
    inputs = case1()
    loss, _ = nft_loss(**{**inputs, "adv": torch.tensor([-2.5])}, beta=BETA, adv_clip_max=C, adv_mode="positive_only")
    plain, _ = nft_loss(**{**inputs, "adv": torch.tensor([0.0])}, beta=BETA, adv_clip_max=C)
    assert loss.item() == plain.item()
    with pytest.raises(ValueError, match=r"adv_mode 'positive'.*'binary'"):
        nft_loss(**inputs, beta=BETA, adv_mode="positive")


# ---------------------------------------------------------------- the brake (restore_frac)
# case1: d = x_t - t·v_old - x0 = [-0.25, 0.5], k = -t = -0.5, Δv = [1, 0], r = 0.75, β = 0.5, c = 5, n = 2.
#   constant (w± = 1): P = 0.75 - 0.25 = 0.5, W = 1
#     g_learn ∝ k·P·d = [0.0625, -0.125] (norm √0.01953125), g_restore ∝ β·k²·W·Δv = [0.125, 0] (norm 0.125)
#   adaptive (w+ = 2, w- = 4): P = 1.5 - 1 = 0.5, W = 2.5: g_learn the same, g_restore = [0.3125, 0]
#   and 2c/n·(g_learn + g_restore) is the whole gradient: [0.9375, -0.625] and [1.875, -0.625]
@pytest.mark.parametrize(
    "weight_mode, restore, gradient",
    [("constant", [0.125, 0.0], [0.9375, -0.625]), ("adaptive", [0.3125, 0.0], [1.875, -0.625])],
)
def test_restore_frac_hand_values(weight_mode, restore, gradient):
    learn = torch.tensor([0.0625, -0.125])
    restore = torch.tensor(restore)
    inputs = case1()
    v_theta = inputs["v_theta"]
    v_theta.retain_grad()
    loss, m = nft_loss(**inputs, beta=BETA, adv_clip_max=C, weight_mode=weight_mode)
    loss.backward()
    # the two parts add up to the loss's gradient in v_θ (2c/n = 5), so the fraction splits the real gradient
    torch.testing.assert_close(v_theta.grad.reshape(2), 5 * (learn + restore))
    torch.testing.assert_close(v_theta.grad.reshape(2), torch.tensor(gradient))
    expected = restore.norm() / (learn.norm() + restore.norm())  # 0.4721 constant, 0.6910 adaptive
    assert m["restore_frac"] == pytest.approx(float(expected), rel=1e-6)


def test_restore_frac_is_0_at_the_old_policy_and_grows_with_delta_v():
    inputs = case1()
    _, m_old = nft_loss(**{**inputs, "v_theta": inputs["v_old"].clone()}, beta=BETA, adv_clip_max=C)
    assert m_old["restore_frac"] == 0.0
    fracs = [nft_loss(**{**inputs, "v_theta": inputs["v_old"] + s * torch.tensor([1.0, 0.0]).reshape(1, 1, 1, 2)},
                      beta=BETA, adv_clip_max=C, weight_mode="constant")[1]["restore_frac"] for s in (0.5, 1.0, 4.0)]
    assert fracs == sorted(fracs) and 0 < fracs[0] and fracs[-1] < 1
    # no learning signal and no move (r = 1/2 with constant weights, v_θ = v_old): 0, not 0/0
    _, m_none = nft_loss(**{**inputs, "v_theta": inputs["v_old"].clone(), "adv": torch.tensor([0.0])}, beta=BETA,
                         adv_clip_max=C, weight_mode="constant")
    assert m_none["restore_frac"] == 0.0
