"""``sd3_nft_ocr_nvlabs``: NVlabs/DiffusionNFT's ``sd3_ocr`` configuration as a recipe. Its values follow the
official batch arithmetic (config/nft.py ``_get_config``), it passes ``--dry-run`` through the launcher, and it
trains 2 steps on the tiny SD3 folder with its algorithm settings as shipped (9 distinct sampler levels per sample,
2 optimizer steps per rollout, the KL anchor, decay schedule 2), only the sizes made small."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from shell_helpers import clean_env, run_handed_in_process

from rlrunner.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "sd3_nft_ocr_nvlabs"
LAUNCHER = ROOT / "examples/diffusion/run_diffusion.sh"
TINY_OCR = ROOT / "examples/diffusion/data/tiny_ocr"
# the upstream OCR train split is not shipped (examples/diffusion/data/ocr/SOURCE.md): train on the test split
NO_TRAIN_SPLIT = [] if (ROOT / "examples/diffusion/data/ocr/train.txt").is_file() else ["env.train.dataset.split=test"]


def _launch(*args: str, log_root: Path) -> subprocess.CompletedProcess:
    env = {**clean_env(), "PYTHON": sys.executable, "RLRUNNER_LOG_ROOT": str(log_root)}
    return subprocess.run(["bash", str(LAUNCHER), RECIPE, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def test_the_recipe_follows_the_official_batch_arithmetic_and_sd3_ocr(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = load_recipe(RECIPE, NO_TRAIN_SPLIT)
    alg, actor, sd3 = cfg.algorithm, cfg.actor, cfg.actor.model.sd3
    # _get_config(n_gpus=8, gradient_step_per_epoch=2): 48 prompts x 24 per epoch, per-GPU batch 9, 8 accumulations
    assert alg.group_size == 24 and cfg.env.train.total_num_envs * cfg.env.train.rollout_epoch == 48 * 24
    assert (actor.micro_batch_size, actor.global_batch_size) == (9, 9 * 8 * 8)
    assert 48 * 24 // actor.global_batch_size == 2  # optimizer steps per rollout
    assert (alg.nft_beta, alg.nft_decay_type, alg.ref_kl_coef, alg.adv_clip_max) == (
        0.1, "delayed_linear_to_0_999", 1e-4, 5.0)
    assert (alg.nft_timesteps_per_sample, alg.nft_train_timesteps, alg.advantage_mode, alg.nft_adv_mode) == (
        math.floor(10 * 0.99), "sampler", "global", "all")
    assert (sd3.num_steps, sd3.train_sampler, sd3.eval_num_steps, sd3.eval_sampler) == (10, "dpm2", 40, "euler")
    assert (sd3.resolution, sd3.lora_rank, sd3.lora_alpha, sd3.guidance_scale, sd3.max_sequence_length) == (
        512, 32, 64, 1.0, 128)
    assert (actor.optim.lr, actor.optim.weight_decay, actor.optim.clip_grad, actor.optim.lr_scheduler) == (
        3e-4, 1e-4, 1.0, "constant")
    assert (cfg.runner.val_check_interval, cfg.runner.save_interval, cfg.env.eval.total_num_envs) == (10, 30, 1018)


def test_the_recipe_passes_dry_run(tmp_path):
    result = run_handed_in_process(["bash", str(LAUNCHER), RECIPE, "--dry-run", *NO_TRAIN_SPLIT],
                                   {**clean_env(), "RLRUNNER_LOG_ROOT": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-3000:]
    resolved = yaml.safe_load(result.stdout)
    assert resolved["algorithm"]["nft_timesteps_per_sample"] == 9 and resolved["actor"]["global_batch_size"] == 576
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_the_recipe_trains_two_steps_on_the_tiny_sd3_folder(tiny_dirs, tmp_path):
    # 2 prompts x 2 images per step in optimizer steps of 2: two per rollout, as the recipe's 1152 / 576; 10 sampler
    # steps kept, so each sample trains at 9 distinct levels of the sampler's grid
    sd3 = "actor.model.sd3"
    small = [f"actor.model.model_path={tiny_dirs('sd3')}", f"{sd3}.resolution=16", f"{sd3}.max_sequence_length=8",
             f"{sd3}.lora_rank=4", f"{sd3}.lora_alpha=8", f"{sd3}.eval_num_steps=2", "algorithm.group_size=2",
             "env.train.total_num_envs=4", "env.train.rollout_epoch=1", "env.eval.total_num_envs=2",
             "actor.micro_batch_size=1", "actor.global_batch_size=2", "actor.model.device=cpu",
             *(f"env.{split}.{key}" for split in ("train", "eval")
               for key in ("reward.model=jpeg_compressibility", f"dataset.path={TINY_OCR}")),
             "cluster.backend=local", "cluster.num_devices_per_node=1", "runner.max_steps=2",
             "runner.val_check_interval=2", "runner.save_interval=2", "runner.val_before_train=false",
             "runner.sample_log_interval=0"]
    result = _launch(*small, log_root=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/actor/nft_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["train/actor/nft_loss"]) and r["train/actor/grad_norm"] > 0
        assert r["train/actor/nonfinite"] == 0 and math.isfinite(r["train/actor/kl"])
        assert r["train/actor/ema_tau"] == 1.0  # decay schedule 2 copies the policy for its first 75 optimizer steps
    assert steps[-1]["train/actor/kl"] > 0  # the anchor to the base model, once θ has left it
    assert any("eval/avg" in r for r in records)
    actor = torch.load(run_dir / "checkpoints/global_step_2/actor.pt", weights_only=False)
    assert actor["optimizer_steps"] == 4  # 2 per rollout
