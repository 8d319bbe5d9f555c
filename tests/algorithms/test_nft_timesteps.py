"""Where NFT's training states come from: the training noise grids (``algorithm.nft_train_timesteps``), draws on a
given grid, and the sampler observer that lets a rollout keep its own states and velocities."""

import pytest
import torch

from rlrunner.algorithms.samplers import SAMPLERS, sample_flow, sample_xt, sigma_schedule, training_grid


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
