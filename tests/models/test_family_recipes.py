"""The GPU recipes of the diffusers families load and validate, and carry the reference values."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlrunner.config.loader import load_recipe
from rlrunner.models.wan import latent_num_frames
from rlrunner.rewards.frames import num_chunks

ROOT = Path(__file__).resolve().parents[2]
OCR_DATA = ROOT / "examples" / "diffusion" / "data" / "ocr"
RECIPES = ["sd3_nft_ocr", "wan22_ti2v_5b_nft_ocr", "wan22_ti2v_5b_nft_video_ocr", "qwen_image_nft_ocr",
           "wan22_t2v_a14b_nft_video_ocr"]


def _load(name: str):
    overrides = []
    if not ((OCR_DATA / "train.txt").is_file() and (OCR_DATA / "test.txt").is_file()):
        # the OCR prompt set is shipped separately; the recipe's other checks still run on the tiny prompts
        overrides = [f"env.{split}.dataset.path=examples/diffusion/data/tiny_ocr" for split in ("train", "eval")]
    return load_recipe(name, overrides)


@pytest.fixture(autouse=True)
def _from_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # recipe paths are relative to the repository root


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_validates_with_shared_reference_values(name):
    cfg = _load(name)
    family = cfg.actor.model[cfg.actor.model.model_type]
    assert cfg.algorithm.nft_beta == 0.1 and cfg.algorithm.adv_clip_max == 5.0
    assert cfg.algorithm.nft_weight_mode == "adaptive" and cfg.algorithm.nft_target_space == "x0"
    assert cfg.algorithm.nft_xcur_source == "resample"
    assert (family.num_steps, family.train_sampler, family.eval_num_steps, family.eval_sampler) == (
        10, "dpm2", 40, "euler")
    assert family.guidance_scale == 1.0  # no CFG in rollouts
    assert (cfg.actor.optim.weight_decay, cfg.actor.optim.clip_grad) == (1e-4, 1.0)
    assert cfg.actor.model.precision == "bf16"
    assert cfg.cluster.component_placement == {"actor,env,rollout": "all"}
    assert not Path(cfg.actor.model.model_path).is_absolute()  # a hub id by default


def test_sd3_recipe():
    cfg = _load("sd3_nft_ocr")
    sd3 = cfg.actor.model.sd3
    assert cfg.actor.model.model_path == "stabilityai/stable-diffusion-3.5-medium"
    assert cfg.algorithm.group_size == 24 and list(cfg.algorithm.nft_tau) == [1.0, 0.01, 30, 70]
    assert (sd3.resolution, sd3.lora_rank, sd3.lora_alpha) == (512, 32, 64)
    assert (cfg.actor.optim.lr, cfg.actor.micro_batch_size, cfg.actor.global_batch_size) == (3e-4, 9, 576)
    assert (cfg.env.train.total_num_envs, cfg.env.train.rollout_epoch, cfg.env.eval.total_num_envs) == (192, 6, 128)


@pytest.mark.parametrize("name", ["wan22_ti2v_5b_nft_ocr", "wan22_ti2v_5b_nft_video_ocr"])
def test_wan_recipes(name):
    cfg = _load(name)
    wan = cfg.actor.model.wan22_ti2v_5b
    assert cfg.actor.model.model_path == "Wan-AI/Wan2.2-TI2V-5B-Diffusers" and wan.condition_mode == "t2v"
    assert list(cfg.algorithm.nft_tau) == [1.0, 0.01, 0, 70] and cfg.algorithm.nft_clip_ratio == 0.1
    assert (cfg.actor.micro_batch_size, cfg.actor.optim.lr) == (4, 4e-4)
    assert cfg.env.train.reward.use_gpu
    if name.endswith("video_ocr"):
        assert (cfg.algorithm.group_size, cfg.algorithm.adv_type, cfg.algorithm.advantage_mode) == (
            8, "grpo_video", "video")
        reward = cfg.env.train.reward
        assert (reward.model, reward.frame_interval, wan.num_frames) == ("video_ocr", 4, 5)
        assert num_chunks(wan.num_frames, reward.frame_interval) == latent_num_frames(wan.num_frames) == 2
    else:
        assert wan.num_frames == 1 and cfg.env.train.reward.model == "ocr"


def test_wan22_a14b_recipe_trains_both_experts_at_480p_81_frames():
    cfg = _load("wan22_t2v_a14b_nft_video_ocr")
    a14b = cfg.actor.model.wan22_t2v_a14b
    assert cfg.actor.model.model_path == "Wan-AI/Wan2.2-T2V-A14B-Diffusers"
    assert (list(a14b.resolution), a14b.num_frames, a14b.train_experts) == ([480, 832], 81, "both")
    assert (a14b.eval_guidance_scale, a14b.eval_guidance_scale_2) == (4.0, 3.0)  # Wan2.2-A14B T2V: high 4, low 3
    assert a14b.gradient_checkpointing and cfg.actor.strategy == "fsdp2"
    assert list(cfg.algorithm.nft_tau) == [1.0, 0.01, 0, 70] and cfg.algorithm.nft_clip_ratio == 0.1  # the 5B's
    reward = cfg.env.train.reward
    assert num_chunks(a14b.num_frames, reward.frame_interval) == latent_num_frames(a14b.num_frames) == 21


def test_qwen_image_recipe():
    cfg = _load("qwen_image_nft_ocr")
    qwen = cfg.actor.model.qwen_image
    assert cfg.actor.model.model_path == "Qwen/Qwen-Image"
    assert (qwen.lora_rank, qwen.lora_alpha, cfg.algorithm.group_size) == (64, 128, 16)
    assert cfg.algorithm.ref_kl_coef == 1e-4
