"""Flow samplers on Gaussian data, whose probability-flow ODE has a closed form, and the training noise grid.

Data x0 ~ N(μ, diag(s²)), x_σ = (1 - σ)·x0 + σ·ε: the marginal is N((1 - σ)·μ, (1 - σ)²s² + σ²) per dimension, the
velocity E[ε - x0 | x_σ = x] = (σ - (1 - σ)s²)/var_σ·(x - (1 - σ)μ) - μ, and the ODE maps noise z to μ + s·z.
"""

import pytest
import torch

from rlrunner.algorithms.samplers import SAMPLERS, sample_flow, sample_xt, sigma_schedule, training_timesteps

MU = torch.tensor([0.5, -1.0])
S = torch.tensor([1.0, 0.7])


def gaussian_velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    t = t[:, None]
    var = (1 - t) ** 2 * S**2 + t**2
    return (t - (1 - t) * S**2) / var * (x - (1 - t) * MU) - MU


def noise(n=256, seed=0):
    return torch.randn(n, 2, generator=torch.Generator().manual_seed(seed))


def test_sigma_schedule_values():
    torch.testing.assert_close(sigma_schedule(4), torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    # shift 3: σ' = 3σ/(1 + 2σ); σ = 0.5 -> 0.75, σ = 0.25 -> 0.5
    torch.testing.assert_close(sigma_schedule(4, shift=3.0), torch.tensor([1.0, 0.9, 0.75, 0.5, 0.0]))
    assert sigma_schedule(3, dtype=torch.float64).dtype == torch.float64
    with pytest.raises(ValueError, match="num_steps"):
        sigma_schedule(0)
    with pytest.raises(ValueError, match="shift"):
        sigma_schedule(4, shift=0.0)


def test_registry_and_unknown_name():
    assert {"euler", "dpm2"} <= set(SAMPLERS)
    with pytest.raises(ValueError, match="'heun'.*dpm2.*euler"):
        sample_flow(gaussian_velocity, noise(), sigma_schedule(4), sampler="heun")


@pytest.mark.parametrize("sampler", ["euler", "dpm2"])
def test_trajectory_and_dtype(sampler):
    z = noise(8)
    x0, traj = sample_flow(gaussian_velocity, z, sigma_schedule(5), sampler=sampler, return_trajectory=True)
    assert len(traj) == 6 and torch.equal(traj[0], z) and torch.equal(traj[-1], x0)

    def bf16_velocity(x, t):
        assert x.dtype == torch.bfloat16 and t.dtype == torch.float32 and t.shape == (8,)
        return gaussian_velocity(x.float(), t).to(torch.bfloat16)

    out = sample_flow(bf16_velocity, z.to(torch.bfloat16), sigma_schedule(5), sampler=sampler)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), x0, atol=0.1, rtol=0.0)


@pytest.mark.parametrize("shift, dpm_steps", [(1.0, 10), (3.0, 20)])
def test_dpm_few_steps_agrees_with_euler_many_steps(shift, dpm_steps):
    """Tolerance 0.05 (max abs, data scale ~1): DPM-Solver++ 2M takes its last step to σ = 0 at first order, so its
    error is dominated by that step, O(σ_{N-1}²)."""
    z = noise()
    exact = MU + S * z
    euler = sample_flow(gaussian_velocity, z, sigma_schedule(500, shift), sampler="euler")
    dpm = sample_flow(gaussian_velocity, z, sigma_schedule(dpm_steps, shift), sampler="dpm2")
    euler_few = sample_flow(gaussian_velocity, z, sigma_schedule(dpm_steps, shift), sampler="euler")
    assert (euler - exact).abs().max() < 0.02
    assert (dpm - euler).abs().max() < 0.05
    assert (dpm - exact).abs().max() < 0.05
    assert (euler_few - exact).abs().max() > 4 * (dpm - exact).abs().max()  # second order beats first order


def test_bad_sigmas():
    with pytest.raises(ValueError, match="non-increasing"):
        sample_flow(gaussian_velocity, noise(), torch.tensor([0.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match="1-D"):
        sample_flow(gaussian_velocity, noise(), torch.tensor([1.0]))


def test_training_timesteps():
    torch.testing.assert_close(training_timesteps(4), torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))


def test_sample_xt():
    x0 = torch.randn(512, 3, 4, generator=torch.Generator().manual_seed(0))
    x_t, t, eps = sample_xt(x0, 4, generator=torch.Generator().manual_seed(1))
    assert t.shape == (512,) and t.dtype == torch.float32
    assert set(t.tolist()) == {1.0, 0.75, 0.5, 0.25}  # k ∈ {0..3}: t = 0 never drawn, every other level is
    torch.testing.assert_close(x_t, (1 - t[:, None, None]) * x0 + t[:, None, None] * eps)
    assert eps.std().item() == pytest.approx(1.0, abs=0.05)
    again = sample_xt(x0, 4, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip((x_t, t, eps), again))
    x_t16, t16, eps16 = sample_xt(x0.to(torch.bfloat16), 4, generator=torch.Generator().manual_seed(1))
    assert x_t16.dtype == eps16.dtype == torch.bfloat16 and t16.dtype == torch.float32
    torch.testing.assert_close(eps16, eps.to(torch.bfloat16))  # same draws whatever the dtype


@pytest.mark.parametrize(("num_steps", "shift"), [(4, 1.0), (6, 3.0)])
def test_dpm_solver_pp_2m_equals_diffusers_scheduler_on_the_same_sigmas(num_steps, shift):
    """Our DPM-Solver++ 2M against diffusers' DPMSolverMultistepScheduler (dpmsolver++, order 2, flow prediction,
    lower order at the last step, final sigma 0) driven over our sigma grid, with a nonlinear velocity field."""
    from diffusers import DPMSolverMultistepScheduler

    def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * (1 + t.view(-1, 1, 1)) + 0.3 * x - 0.1

    noise = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    sigmas = sigma_schedule(num_steps, shift=shift)
    ours = sample_flow(velocity, noise, sigmas, sampler="dpm_solver_pp_2m")

    scheduler = DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", solver_order=2, use_flow_sigmas=True,
                                            prediction_type="flow_prediction", lower_order_final=True,
                                            final_sigmas_type="zero")
    scheduler.set_timesteps(num_steps)
    scheduler.sigmas = sigmas.clone()  # the same grid (diffusers' own would start at 1 - 1/1000)
    scheduler.timesteps = sigmas[:-1] * scheduler.config.num_train_timesteps
    x = noise.clone()
    for sigma, timestep in zip(sigmas[:-1], scheduler.timesteps):
        x = scheduler.step(velocity(x, sigma.expand(len(x))), timestep, x).prev_sample
    torch.testing.assert_close(ours, x, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(ours, sample_flow(velocity, noise, sigmas, sampler="euler"), atol=1e-3)
