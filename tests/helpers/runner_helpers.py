"""Shared set-up for runner and checkpoint tests: a tiny random model, a prompt set, and a small recipe."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import DictConfig

import rlrunner.objectives.nft as nft_objective_module
from rlrunner.models.tiny_text import write_random_tiny
from rlrunner.recipe import load_recipe
from rlrunner.workers.rollout import RolloutWorker

# A recipe small enough for a CPU test (about a second per step): random 16x32 tiny model, 2 Euler steps,
# 2 prompts x 4 samples per step, and a cheap reward that differs between samples.
SMALL_OVERRIDES = [
    "actor.model.tiny.resolution=[16,32]",
    "actor.model.tiny.num_steps=2",
    "actor.model.tiny.eval_num_steps=3",
    "actor.model.tiny.lora_rank=4",
    "actor.model.tiny.lora_alpha=4",
    "algorithm.group_size=4",
    "algorithm.nft_tau=[1.0,0.5,0,2]",
    "env.train.total_num_envs=8",
    "env.eval.total_num_envs=4",
    "env.train.reward.model=jpeg_compressibility",
    "env.eval.reward.model=jpeg_compressibility",
    "actor.micro_batch_size=2",
    "actor.global_batch_size=4",
    "actor.optim.lr=1e-2",
    "runner.val_check_interval=2",
    "runner.sample_log_interval=1",
    "runner.num_logged_samples=4",
    "cluster.backend=local",
    "runner.async_reward=true",  # the GPU recipes' default path: reward of one rollout round beside the next
]


def make_assets(root: Path) -> tuple[Path, Path]:
    """Random tiny model folder and a prompt directory with train/test splits under ``root``."""
    model = Path(write_random_tiny(str(root / "model")))
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    (data / "train.txt").write_text("".join(f'a sign that says "{n}"\n' for n in range(2345, 2361)))
    (data / "test.txt").write_text("".join(f'a label that reads "{n}"\n' for n in range(6789, 6797)))
    return model, data


def small_recipe(root: Path, *overrides: str) -> DictConfig:
    model, data = make_assets(root) if not (root / "model").exists() else (root / "model", root / "data")
    paths = [f"actor.model.model_path={model}", f"env.train.dataset.path={data}", f"env.eval.dataset.path={data}",
             f"runner.logger.log_path={root / 'logs'}"]
    return load_recipe("tiny_nft_ocr", [*SMALL_OVERRIDES, *paths, *overrides])


def run_small(root: Path, name: str, *overrides: str) -> Path:
    """Run :func:`small_recipe` with ``overrides`` in the run folder ``root/logs/name``; returns that folder."""
    from rlrunner.run.runner import run

    log_dir = root / "logs" / name
    log_dir.mkdir(parents=True)
    run(small_recipe(root, *overrides), log_dir)
    return log_dir


def checkpoint_adapters(checkpoint: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Both adapters of a checkpoint folder, as its actor state holds them."""
    return torch.load(checkpoint / "actor.pt", weights_only=False)["adapters"]


def assert_same_adapters(a: Path, b: Path) -> None:
    """Checkpoints ``a`` and ``b`` hold bitwise equal adapters, key by key."""
    ours, theirs = checkpoint_adapters(a), checkpoint_adapters(b)
    for adapter in ("default", "ema"):
        assert ours[adapter].keys() == theirs[adapter].keys(), adapter
        for key, tensor in theirs[adapter].items():
            assert torch.equal(ours[adapter][key], tensor), f"{adapter} {key}"


def read_metrics(log_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]


def train_metrics(log_dir: Path) -> list[dict]:
    return [m for m in read_metrics(log_dir) if "env/avg" in m]


def spy_on_sampling(monkeypatch) -> list[dict]:
    """Record every ``FlowModel.sample`` call that ``RolloutWorker.generate`` makes (in-process workers): one dict per
    call with the generate call's ``mode``, ``group_size`` and number of ``prompts``, the sample call's ``noise``
    (a copy) and its keyword arguments (``sampler``, ``num_steps``, ``adapter``, ...)."""
    calls: list[dict] = []
    original = RolloutWorker.generate

    def spy(self, prompts, group_size, step, round_index, mode="train", rows=None):
        sample = self.model.sample

        def recording_sample(cond, noise, **kwargs):
            calls.append({"mode": mode, "group_size": group_size, "prompts": len(prompts), "noise": noise.clone(),
                          **kwargs})
            return sample(cond, noise, **kwargs)

        self.model.sample = recording_sample
        try:
            return original(self, prompts, group_size, step, round_index, mode, rows)
        finally:
            self.model.sample = sample

    monkeypatch.setattr(RolloutWorker, "generate", spy)
    return calls


def spy_on_nft_timesteps(monkeypatch) -> list[torch.Tensor]:
    """Record the noise levels ``t`` ``[B]`` of every NFT loss call (in-process workers), in call order."""
    times: list[torch.Tensor] = []
    original = nft_objective_module.nft_loss

    def recording(v_theta, v_old, x_t, x0, t, *args, **kwargs):
        times.append(t.clone())
        return original(v_theta, v_old, x_t, x0, t, *args, **kwargs)

    monkeypatch.setattr(nft_objective_module, "nft_loss", recording)
    return times
