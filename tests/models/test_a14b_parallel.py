"""Wan2.2 A14B's two experts under DDP and FSDP2, with and without context parallelism, on 2 CPU gloo ranks: the
loss, the reduced LoRA gradients of a micro-batch and the adapters after an update equal one device's, whether the
micro-batch straddles the expert boundary or leaves one expert without rows (micro-batch 1, as the shipped recipe).

An expert without rows runs on a weight-0 dummy where a wrapper needs it (``rlrunner/models/wan_a14b.py``); under CP
diffusers' sharder refused the one-token dummy ("must be divisible by mesh size"), and under FSDP2 the dummy ran on
every micro-batch, all-gathering the idle expert's blocks though no rank had rows for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cp_helpers import actor_results, assert_same_training, high_noise_rows, rank_results, reference_run, spawn
from omegaconf import OmegaConf
from runner_helpers import small_recipe
from shell_helpers import clean_env

from rlrunner.workers.actor import ActorWorker

A14B = "wan22_t2v_a14b"
#: 32 px, 5 frames: a [16, 2, 4, 4] latent, 2 x 2 x 2 = 8 tokens of 2 heads, which split over 2 ranks
SETTINGS = ["resolution=32", "num_frames=5", "max_sequence_length=8", "num_steps=2", "eval_num_steps=2",
            "lora_rank=4", "lora_alpha=8"]
ENGINES = [(strategy, cp) for strategy in ("ddp", "fsdp2") for cp in (1, 2)]


def _straddling_seed() -> int:
    """An actor seed whose first two samples of step 0 (the compared micro-batch) go to different experts."""
    return next(seed for seed in range(1000) if len(set(high_noise_rows(seed, 0, 2))) == 2)


#: scenario -> (actor seed, micro-batch size): both experts in one micro-batch, or one expert idle in each
SCENARIOS = {"straddling": (_straddling_seed(), 2), "idle_expert": (0, 1)}


def _recipe(root: Path, tiny_dirs, seed: int, micro_batch_size: int):
    return small_recipe(root, f"actor.model.model_type={A14B}", f"actor.model.model_path={tiny_dirs(A14B)}",
                        "actor.model.precision=fp32", "actor.model.device=cpu", "actor.optim.lr=1e-3",
                        f"actor.seed={seed}", f"actor.micro_batch_size={micro_batch_size}",
                        "algorithm.adv_type=grpo_video", "algorithm.advantage_mode=video",
                        *[f"actor.model.{A14B}.{s}" for s in SETTINGS])


def _engine_ranks(rank: int, world_size: int, root: str) -> None:
    """Every scenario under every engine on this rank; besides the results, how often an idle expert ran its dummy."""
    from rlrunner.models.wan_a14b import SigmaExperts

    idle_calls = [0]
    dummy = SigmaExperts._idle_call

    def counted(self, *args):
        idle_calls[0] += 1
        return dummy(self, *args)

    SigmaExperts._idle_call = counted
    for scenario in SCENARIOS:
        folder = Path(root) / scenario
        for strategy, cp in ENGINES:
            cfg = OmegaConf.merge(OmegaConf.load(folder / "recipe.yaml"), OmegaConf.from_dotlist(
                [f"actor.strategy={strategy}", f"actor.context_parallel_size={cp}"]))
            batch, advantages = torch.load(folder / "data.pt", weights_only=False)
            idle_calls[0] = 0
            actor = ActorWorker(cfg.actor, cfg.algorithm, 2, rank=rank, world_size=world_size)
            result = actor_results(actor, batch, advantages, cfg)
            torch.save({**result, "idle_calls": idle_calls[0]}, folder / f"{strategy}_cp{cp}_rank{rank}.pt")
            del actor


@pytest.mark.slow
def test_a14b_trains_as_one_device_under_ddp_and_fsdp2_with_and_without_cp(tmp_path, tiny_dirs):
    """{ddp, fsdp2} x {cp 1, 2} x {straddling, idle expert} on 2 gloo ranks vs one device (atol 1e-5, fp32)."""
    references = {}
    for scenario, (seed, micro) in SCENARIOS.items():
        folder = tmp_path / scenario
        folder.mkdir()
        cfg = _recipe(tmp_path, tiny_dirs, seed, micro)
        *_, references[scenario] = reference_run(cfg, folder)
    spawn(_engine_ranks, 2, str(tmp_path))
    for scenario in SCENARIOS:
        for strategy, cp in ENGINES:
            name = f"{strategy}_cp{cp}"
            ours = rank_results(tmp_path / scenario, name, 2)
            assert_same_training(ours, references[scenario])
            if cp == 2:  # the CP group's ranks hold one gradient
                grads = [torch.load(tmp_path / scenario / f"{name}_rank{r}.pt", weights_only=False)["micro"]["grads"]
                         for r in (0, 1)]
                assert all(torch.equal(a, b) for a, b in zip(*grads)), f"{scenario} {name}"
            if strategy == "fsdp2" and cp == 2:  # one data-parallel group: no rank has rows for an idle expert
                assert ours["idle_calls"] == 0, f"{scenario}: FSDP2 gathered an expert that no rank runs"
    # DDP needs the idle expert's zero gradient in every training micro-batch of one row
    assert rank_results(tmp_path / "idle_expert", "ddp_cp2", 2)["idle_calls"] > 0


@pytest.mark.ray
@pytest.mark.slow
def test_the_a14b_recipe_trains_with_actor_cp2_and_micro_batch_1_through_the_launcher(tmp_path, tiny_dirs):
    """The shipped recipe (FSDP2, both experts, micro-batch 1, Ray) on the tiny two-expert folder with the actor and
    the rollout context parallel over 2 devices: 2 steps through run_diffusion.sh (it crashed at the first update)."""
    import json
    import math
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    tiny_ocr = root / "examples/diffusion/data/tiny_ocr"
    overrides = [f"actor.model.model_path={tiny_dirs(A14B)}", "actor.model.device=cpu", "actor.model.precision=fp32",
                 *[f"actor.model.{A14B}.{s}" for s in SETTINGS],
                 "actor.context_parallel_size=2", "rollout.context_parallel_size=2", "actor.micro_batch_size=1",
                 "actor.global_batch_size=4", "algorithm.group_size=2", "env.train.total_num_envs=4",
                 "env.eval.total_num_envs=2", "cluster.num_devices_per_node=2", "cluster.worker_timeout_s=300",
                 *(f"env.{split}.{key}" for split in ("train", "eval")
                   for key in ("reward.model=jpeg_compressibility", f"dataset.path={tiny_ocr}")),
                 "runner.max_steps=2", "runner.val_check_interval=0", "runner.val_before_train=false",
                 "runner.save_interval=0", "runner.sample_log_interval=0"]
    env = {**clean_env(), "PYTHON": sys.executable, "RLRUNNER_LOG_ROOT": str(tmp_path)}
    result = subprocess.run(["bash", str(root / "examples/diffusion/run_diffusion.sh"), "wan22_t2v_a14b_nft_video_ocr",
                             *overrides], cwd=root, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/actor/nft_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(math.isfinite(r["train/actor/nft_loss"]) and r["train/actor/grad_norm"] > 0 for r in steps)
