"""EMA schedules at their boundary steps and the in-place update."""

import pytest
import torch

from rlrunner.algorithms.ema import DECAY_SCHEDULES, decay_at, ema_update_, tau_at


def test_tau_scalar():
    assert tau_at(0.3, 0) == 0.3
    assert tau_at(1, 10**6) == 1.0


@pytest.mark.parametrize(
    "step, expected",
    [(-5, 1.0), (0, 1.0), (10, 1.0), (35, 0.5), (60, 0.0), (61, 0.0), (1000, 0.0)],
)
def test_tau_linear_schedule(step, expected):
    # [start, end, s0, s1] = [1, 0, 10, 60]: flat 1 up to step 10, linear to 0 at step 60, flat after
    assert tau_at([1.0, 0.0, 10, 60], step) == pytest.approx(expected)
    assert tau_at((1.0, 0.0, 10, 60), step) == pytest.approx(expected)


@pytest.mark.parametrize("spec", ["0.1", None, [1.0, 0.0, 5], [1.0, 0.0, 60, 10], [1, "a", 0, 1], True, -0.1])
def test_tau_bad_spec_names_it(spec):
    with pytest.raises(ValueError, match="nft_tau"):
        tau_at(spec, 0)


@pytest.mark.parametrize(
    "kind, step, expected",
    [
        ("copy", 0, 0.0),
        ("copy", 10**6, 0.0),
        ("linear_to_0_5", 0, 0.0),
        ("linear_to_0_5", 1, 0.001),
        ("linear_to_0_5", 499, 0.499),
        ("linear_to_0_5", 500, 0.5),
        ("linear_to_0_5", 10**6, 0.5),
        ("delayed_linear_to_0_999", 0, 0.0),
        ("delayed_linear_to_0_999", 74, 0.0),
        ("delayed_linear_to_0_999", 75, 0.0),
        ("delayed_linear_to_0_999", 76, 0.0075),
        ("delayed_linear_to_0_999", 208, 0.9975),  # 0.0075·133
        ("delayed_linear_to_0_999", 209, 0.999),  # 0.0075·134 = 1.005 capped
        ("delayed_linear_to_0_999", 10**6, 0.999),
    ],
)
def test_decay_schedules(kind, step, expected):
    assert decay_at(kind, step) == pytest.approx(expected)


def test_decay_unknown_kind_lists_valid():
    with pytest.raises(ValueError, match="'cosine'.*delayed_linear_to_0_999"):
        decay_at("cosine", 0)


def make():
    ema = [torch.zeros(3), torch.full((2, 2), 4.0, dtype=torch.float64)]
    params = [torch.ones(3, requires_grad=True), torch.zeros(2, 2, dtype=torch.bfloat16)]
    return ema, params


@pytest.mark.parametrize("tau", [1.0, 2.5])
def test_ema_update_copies_for_tau_at_least_one(tau):
    ema, params = make()
    ema_update_(ema, params, tau)
    assert torch.equal(ema[0], torch.ones(3)) and torch.equal(ema[1], torch.zeros(2, 2, dtype=torch.float64))
    assert not ema[0].requires_grad and ema[1].dtype == torch.float64


def test_ema_update_small_tau():
    ema, params = make()
    ema_update_(iter(ema), iter(params), 0.01)  # generators are fine (e.g. module.parameters())
    torch.testing.assert_close(ema[0], torch.full((3,), 0.01))  # 0.99·0 + 0.01·1
    torch.testing.assert_close(ema[1], torch.full((2, 2), 3.96, dtype=torch.float64))  # 0.99·4 + 0.01·0


def test_ema_update_tau_zero_and_official_decay_spelling():
    ema, params = make()
    ema_update_(ema, params, 0.0)
    assert torch.equal(ema[0], torch.zeros(3))
    ema_update_(ema, params, 1 - decay_at("linear_to_0_5", 250))  # η = 0.25: ema ← 0.25·ema + 0.75·θ
    torch.testing.assert_close(ema[0], torch.full((3,), 0.75))


def test_ema_update_checks():
    ema, params = make()
    with pytest.raises(ValueError, match="2 tensors but params has 1"):
        ema_update_(ema, params[:1], 0.1)
    with pytest.raises(ValueError, match=r"tensor 0.*\(3,\).*\(4,\)"):
        ema_update_(ema, [torch.zeros(4), params[1]], 0.1)
    with pytest.raises(ValueError, match="tau"):
        ema_update_(ema, params, -0.5)


# NVlabs' DiffusionNFT trainer names its schedules by number (config.decay_type); verl-omni uses our names with
# the same (flat, rate, cap). The official function, transliterated: η = 0 before `flat`, else min((step - flat)·rate,
# cap), with the official operand order.
OFFICIAL_DECAY_TYPES = {0: "copy", 1: "linear_to_0_5", 2: "delayed_linear_to_0_999"}


def official_return_decay(step: int, decay_type: int) -> float:
    flat, uprate, uphold = {0: (0, 0.0, 0.0), 1: (0, 0.001, 0.5), 2: (75, 0.0075, 0.999)}[decay_type]
    return 0.0 if step < flat else min((step - flat) * uprate, uphold)


# hand-written: (type, step) -> η at the corners of each schedule
DECAY_TABLE = {
    (0, 0): 0.0, (0, 150): 0.0, (0, 300): 0.0,
    (1, 0): 0.0, (1, 1): 0.001, (1, 100): 0.1, (1, 250): 0.25, (1, 300): 0.3,
    (2, 0): 0.0, (2, 75): 0.0, (2, 76): 0.0075, (2, 100): 0.1875, (2, 175): 0.75, (2, 208): 0.9975, (2, 209): 0.999,
    (2, 300): 0.999,
}


def test_decay_types_equal_the_official_return_decay_at_every_step_to_300():
    assert set(OFFICIAL_DECAY_TYPES.values()) == set(DECAY_SCHEDULES)
    for (decay_type, step), eta in DECAY_TABLE.items():
        assert decay_at(OFFICIAL_DECAY_TYPES[decay_type], step) == pytest.approx(eta, abs=1e-12)
    for decay_type, kind in OFFICIAL_DECAY_TYPES.items():
        for step in range(301):
            assert decay_at(kind, step) == official_return_decay(step, decay_type), (kind, step)  # bit for bit
