"""Where NFT's training states come from: the training noise grids (``algorithm.nft_train_timesteps``), draws on a
given grid, and the sampler observer that lets a rollout keep its own states and velocities."""

import pytest
import torch

from rlrunner.algorithms.samplers import (
    SAMPLERS,
    distinct_levels,
    sample_flow,
    sample_xt,
    sigma_schedule,
    training_grid,
)
from rlrunner.step.sample_order import level_seed


def test_training_grids_hand_values():
    shifted = sigma_schedule(4, 3.0)
    torch.testing.assert_close(training_grid("uniform", shifted), torch.tensor([1.0, 0.75, 0.5, 0.25]))
    # the sampler's sigmas at shift 3: σ' = 3σ/(1 + 2σ); 0.75 -> 0.9, 0.5 -> 0.75, 0.25 -> 0.5
    torch.testing.assert_close(training_grid("sampler", shifted), torch.tensor([1.0, 0.9, 0.75, 0.5]))
    assert torch.equal(training_grid("sampler", shifted), shifted[:4])
    # any sampler grid, e.g. a pipeline's own schedule that ends at a small sigma before 0
    pipeline_grid = torch.tensor([1.0, 0.86, 0.6, 0.0089, 0.0])
    assert torch.equal(training_grid("sampler", pipeline_grid), pipeline_grid[:4])
    for num_steps in (2, 4, 10):  # the step counts of the test and CPU recipes: the grids coincide at shift 1
        plain = sigma_schedule(num_steps, 1.0)
        assert torch.equal(training_grid("sampler", plain), training_grid("uniform", plain))
    with pytest.raises(ValueError, match=r"'shifted'.*\['sampler', 'uniform'\]"):
        training_grid("shifted", shifted)


def test_sample_xt_draws_t_from_the_given_grid():
    x0 = torch.randn(64, 1, 3, 3, generator=torch.Generator().manual_seed(0))
    grid = training_grid("sampler", sigma_schedule(4, 3.0))
    generators = [torch.Generator().manual_seed(i) for i in range(64)]
    x_t, t, eps = sample_xt(x0, grid, generator=generators)
    assert set(t.tolist()) == set(grid.tolist())  # every level of the grid, nothing else
    t_b = t[:, None, None, None]
    torch.testing.assert_close(x_t, (1 - t_b) * x0 + t_b * eps)
    # an int N is RLinf's grid: the same draws as the uniform grid given explicitly, bit for bit
    by_count = sample_xt(x0, 4, generator=torch.Generator().manual_seed(3))
    by_grid = sample_xt(x0, training_grid("uniform", sigma_schedule(4)), generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(by_count, by_grid))
    with pytest.raises(ValueError, match="1-D"):
        sample_xt(x0, torch.ones(2, 2))


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_observer_sees_each_step_state_sigma_and_velocity(sampler):
    def velocity_fn(x, t):
        return 0.3 * x + t[:, None]

    noise = torch.randn(5, 2, generator=torch.Generator().manual_seed(1))
    sigmas = sigma_schedule(6, shift=3.0)
    seen = []
    x0, states = sample_flow(velocity_fn, noise, sigmas, sampler=sampler, return_trajectory=True,
                             observer=lambda x, t, v: seen.append((x.clone(), t.clone(), v.clone())))
    plain = sample_flow(velocity_fn, noise, sigmas, sampler=sampler)
    assert torch.equal(x0, plain)  # observing changes nothing
    assert len(seen) == 6  # one evaluation per step, in step order: step i at the state x_i and σ_i
    for i, (x, t, v) in enumerate(seen):
        assert torch.equal(x, states[i]) and torch.equal(v, velocity_fn(x, t))
        assert torch.equal(t, torch.full((5,), float(sigmas[i].double()), dtype=torch.float32))
    assert torch.equal(seen[0][0], noise)


# ---------------------------------------------------------------- distinct levels per sample (nft_timesteps_per_sample)
def _levels(num_levels: int, draws: int, samples: int) -> torch.Tensor:
    """[samples, draws] levels, each sample's generator seeded as the actor seeds it (seed 0, step 3, position n)."""
    return torch.stack([distinct_levels(num_levels, draws, torch.Generator().manual_seed(level_seed(0, 3, n)))
                        for n in range(samples)])


def test_distinct_levels_are_distinct_per_sample_and_uniform_over_samples():
    levels = _levels(10, 4, 2000)
    assert all(len(set(row.tolist())) == 4 for row in levels)  # K distinct levels per sample, t = 1 (level 0) too
    # each level is drawn 2000·4/10 = 800 times in expectation, and so is each level of each single draw (200):
    # chi-square with 9 degrees of freedom stays below 27.88 with probability 0.999 (the seed is fixed)
    for counts, expected in ((torch.bincount(levels.flatten(), minlength=10), 800.0),
                             *((torch.bincount(levels[:, j], minlength=10), 200.0) for j in range(4))):
        assert ((counts.float() - expected).square() / expected).sum() < 27.88


def test_more_draws_than_levels_repeat_each_level_evenly():
    for row in _levels(3, 7, 20):  # 7 draws on 3 levels: each level 2 or 3 times, each chain of 3 a permutation
        assert sorted(torch.bincount(row, minlength=3).tolist()) == [2, 2, 3]
        assert sorted(row[:3].tolist()) == sorted(row[3:6].tolist()) == [0, 1, 2]


def test_given_levels_pick_t_and_the_generators_draw_only_the_noise():
    x0 = torch.randn(3, 1, 2, 2, generator=torch.Generator().manual_seed(0))
    grid = torch.tensor([1.0, 0.75, 0.5, 0.25])
    x_t, t, eps = sample_xt(x0, grid, generator=[torch.Generator().manual_seed(i) for i in range(3)],
                            levels=torch.tensor([0, 3, 1]))
    assert t.tolist() == [1.0, 0.25, 0.75]
    for i in range(3):  # ε is the generator's first draw: no level was drawn from it
        assert torch.equal(eps[i], torch.randn(x0[i].shape, generator=torch.Generator().manual_seed(i)))
    torch.testing.assert_close(x_t, (1 - t[:, None, None, None]) * x0 + t[:, None, None, None] * eps)
    with pytest.raises(ValueError, match=r"levels must be \[B\] = \(3,\) grid indices in \[0, 4\)"):
        sample_xt(x0, grid, generator=torch.Generator(), levels=torch.tensor([0, 4, 1]))
