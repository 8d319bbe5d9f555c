"""Learning test: NFT raises the reward of a toy 2-D flow model; the r = 0.5 control does not.

A small MLP velocity model is pretrained with flow matching on a mixture of four Gaussians (one per quadrant),
then fine-tuned online: rollouts from the EMA ("old") policy with the Euler sampler, reward 1 for landing in the
first quadrant, group advantages, ``nft_loss`` on freshly noised rollouts, EMA update. The control run is
identical except that the advantages are zeroed (r = 0.5 everywhere: no reward signal).
"""

import copy
import time

import pytest
import torch
from torch import nn

from rlrunner.algorithms.advantages import group_advantages
from rlrunner.algorithms.ema import ema_update_, tau_at
from rlrunner.algorithms.nft_loss import nft_loss
from rlrunner.algorithms.samplers import sample_flow, sample_xt, sigma_schedule

MODES = torch.tensor([[2.0, 2.0], [-2.0, 2.0], [-2.0, -2.0], [2.0, -2.0]])
NUM_STEPS = 8  # sampler steps (rollout and training grid)
GROUPS, GROUP_SIZE = 8, 16


class VelocityMLP(nn.Module):
    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(3, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 2)
        )

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x, t[:, None]], dim=1))


def sample_data(n: int, g: torch.Generator) -> torch.Tensor:
    return MODES[torch.randint(0, 4, (n,), generator=g)] + 0.4 * torch.randn(n, 2, generator=g)


def reward(x: torch.Tensor) -> torch.Tensor:
    return ((x[:, 0] > 0) & (x[:, 1] > 0)).float()


def pretrain(g: torch.Generator, steps: int = 600) -> VelocityMLP:
    model = VelocityMLP()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        x0 = sample_data(256, g)
        t = torch.rand(256, generator=g)
        noise = torch.randn(256, 2, generator=g)
        x_t = (1 - t[:, None]) * x0 + t[:, None] * noise
        loss = (model(x_t, t) - (noise - x0)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def mean_reward(model: nn.Module, g: torch.Generator, n: int = 1024) -> float:
    with torch.no_grad():
        x0 = sample_flow(model, torch.randn(n, 2, generator=g), sigma_schedule(NUM_STEPS))
    return reward(x0).mean().item()


def finetune(base: VelocityMLP, use_reward: bool, steps: int, seed: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    model, old = copy.deepcopy(base), copy.deepcopy(base)
    old.requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    history = []
    for step in range(steps):
        with torch.no_grad():  # rollout with the old (EMA) policy
            x0 = sample_flow(old, torch.randn(GROUPS * GROUP_SIZE, 2, generator=g), sigma_schedule(NUM_STEPS))
        rewards = reward(x0)
        history.append(rewards.mean().item())
        adv = group_advantages(rewards, GROUP_SIZE) if use_reward else torch.zeros_like(rewards)
        x_t, t, _ = sample_xt(x0, NUM_STEPS, generator=g)
        with torch.no_grad():
            v_old = old(x_t, t)
        loss, _ = nft_loss(model(x_t, t), v_old, x_t, x0, t, adv, beta=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema_update_(old.parameters(), model.parameters(), tau_at([1.0, 0.3, 0, steps // 2], step))
    return history


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_nft_raises_reward_above_start_and_control(one_thread):
    start = time.perf_counter()
    base = pretrain(torch.Generator().manual_seed(0))
    r0 = mean_reward(base, torch.Generator().manual_seed(1))
    steps = 200
    nft = finetune(base, use_reward=True, steps=steps, seed=2)
    ctrl = finetune(base, use_reward=False, steps=steps, seed=2)
    r_nft = sum(nft[-20:]) / 20
    r_ctrl = sum(ctrl[-20:]) / 20
    print(f"start {r0:.3f}  nft {r_nft:.3f}  control {r_ctrl:.3f}  ({time.perf_counter() - start:.1f}s)")
    assert 0.15 < r0 < 0.35  # the pretrained model covers all four modes: about 1/4 in the rewarded quadrant
    assert r_nft > r0 + 0.4
    assert r_nft > r_ctrl + 0.4
    assert abs(r_ctrl - r0) < 0.1  # no reward signal, no learning
