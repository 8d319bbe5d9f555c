"""The GPU recipes of the diffusers families load and validate, and carry the reference values."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlrunner.models.wan import latent_num_frames
from rlrunner.recipe import load_recipe
from rlrunner.rewards.frames import num_chunks

ROOT = Path(__file__).resolve().parents[2]
OCR_DATA = ROOT / "examples" / "diffusion" / "data" / "ocr"
RECIPES = ["sd3_nft_ocr", "wan22_ti2v_5b_nft_ocr", "wan22_ti2v_5b_nft_video_ocr", "qwen_image_nft_ocr"]
RECIPES += ["zimage_nft_ocr"]
RECIPES += ["wan22_t2v_a14b_nft_video_ocr"]


def _load(name: str, *extra: str):
    overrides = list(extra)
    if not ((OCR_DATA / "train.txt").is_file() and (OCR_DATA / "test.txt").is_file()):
        # the OCR prompt set is shipped separately; the recipe's other checks still run on the tiny prompts
        overrides += [f"env.{split}.dataset.path=examples/diffusion/data/tiny_ocr" for split in ("train", "eval")]
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


def test_zimage_recipe():
    """Flow-Factory's Z-Image NFT settings (examples/nft/lora/z_image/default.yaml)."""
    cfg = _load("zimage_nft_ocr")
    zimage = cfg.actor.model.zimage
    assert cfg.actor.model.model_path == "Tongyi-MAI/Z-Image" and zimage.guidance == "auto"
    assert (zimage.resolution, zimage.lora_rank, zimage.lora_alpha, zimage.shift) == (512, 64, 128, None)
    assert (zimage.cfg_truncation, zimage.cfg_normalization) == (1.0, 0.0)
    assert (cfg.algorithm.group_size, cfg.actor.optim.lr, cfg.actor.global_batch_size) == (16, 3e-4, 768)
    assert cfg.env.train.total_num_envs * cfg.env.train.rollout_epoch == 48 * 16


def test_flux2_klein_recipe():
    """Flow-Factory's klein-base NFT settings (examples/nft/lora/flux2_klein_base/default.yaml): 384 px, 8 steps,
    28 eval steps, no CFG in rollouts."""
    cfg = _load("flux2_klein_nft_ocr")
    klein = cfg.actor.model.flux2_klein
    assert cfg.actor.model.model_path == "black-forest-labs/FLUX.2-klein-base-4B"
    assert (klein.resolution, klein.num_steps, klein.eval_num_steps, klein.guidance_scale) == (384, 8, 28, 1.0)
    assert (klein.lora_rank, klein.lora_alpha, klein.shift, cfg.actor.optim.lr) == (64, 128, None, 1e-4)
    assert (cfg.algorithm.group_size, cfg.algorithm.nft_beta, cfg.algorithm.adv_clip_max) == (16, 0.1, 5.0)
    assert cfg.actor.model.precision == "bf16" and cfg.cluster.component_placement == {"actor,env,rollout": "all"}


NEW_FAMILY_RECIPES = {"zimage": "zimage_nft_ocr", "flux2_klein": "flux2_klein_nft_ocr"}


@pytest.mark.parametrize("model_type", sorted(NEW_FAMILY_RECIPES))
def test_bad_family_inputs_fail_before_launch(model_type, tiny_dirs, tmp_path):
    """One line each from the recipe check, before any worker: a guidance kind the family lacks, a folder of
    another pipeline class, a resolution that does not patch evenly (tiny VAEs: 2x down, patch 2)."""
    from rlrunner.config.errors import RecipeError

    name, key = NEW_FAMILY_RECIPES[model_type], f"actor.model.{model_type}"
    folder = f"actor.model.model_path={tiny_dirs(model_type)}"
    with pytest.raises(RecipeError, match=f"{key}.guidance='embedded' is not supported by this family"):
        _load(name, f"{key}.guidance=embedded")
    (tmp_path / "model_index.json").write_text('{"_class_name": "FluxPipeline"}')
    with pytest.raises(RecipeError, match=f"holds a FluxPipeline pipeline, but model_type '{model_type}'"):
        _load(name, f"actor.model.model_path={tmp_path}")
    with pytest.raises(RecipeError, match="resolution 18x18 must be divisible by 4.*nearest valid: 16x16"):
        _load(name, folder, f"{key}.resolution=18")
    auto = _load(name, folder, "actor.model.model_type=auto")
    assert auto.actor.model.model_type == model_type


def test_flux1_dev_recipe():
    """FLUX.1-dev: flow_grpo's 512 px, guidance 3.5 and LoRA 64/128 with Flow-Factory NFT's 8 ODE steps."""
    cfg = _load("flux1_dev_nft_ocr")
    flux = cfg.actor.model.flux1
    assert cfg.actor.model.model_path == "black-forest-labs/FLUX.1-dev" and cfg.actor.model.model_type == "flux1"
    assert (flux.resolution, flux.num_steps, flux.eval_num_steps, flux.max_sequence_length) == (512, 8, 28, 128)
    assert (flux.guidance, flux.guidance_scale, flux.eval_guidance_scale, flux.shift) == ("auto", 3.5, 3.5, None)
    assert (flux.lora_rank, flux.lora_alpha, cfg.algorithm.group_size) == (64, 128, 24)
    assert (cfg.algorithm.nft_beta, list(cfg.algorithm.nft_tau)) == (0.1, [1.0, 0.01, 30, 70])
    assert (cfg.actor.optim.lr, cfg.actor.optim.weight_decay, cfg.actor.strategy) == (3e-4, 1e-4, "fsdp2")


def test_sd35_large_recipe():
    """SD3.5-Large on the DiffusionNFT SD3.5-M OCR settings (no published SD3.5-L RL setting)."""
    cfg = _load("sd35_large_nft_ocr")
    sd3 = cfg.actor.model.sd3
    assert cfg.actor.model.model_path == "stabilityai/stable-diffusion-3.5-large" and cfg.actor.model.model_type == "sd3"
    assert (sd3.resolution, sd3.num_steps, sd3.eval_num_steps, sd3.guidance_scale) == (512, 10, 40, 1.0)
    assert (sd3.lora_rank, sd3.lora_alpha, cfg.algorithm.group_size) == (32, 64, 24)
    assert (cfg.actor.micro_batch_size, cfg.actor.global_batch_size, cfg.actor.optim.lr) == (9, 576, 3e-4)


@pytest.mark.slow  # sizes the published 12B / 8B models on the meta device (peft's LoRA injection: ~10-20 s each)
@pytest.mark.parametrize(("name", "folder", "model_type"), [
    ("flux1_dev_nft_ocr", "flux.1-dev", "flux1"),
    ("sd35_large_nft_ocr", "stable-diffusion-3.5-large", "sd3"),
    # both 14B experts, 480x832 x 81 frames: with actor and rollout context parallel over 4 devices (no CP: 116 GiB)
    ("wan22_t2v_a14b_nft_video_ocr", "wan2.2-t2v-a14b", "wan22_t2v_a14b"),
])
def test_recipe_fits_eight_80gb_devices_by_the_plan(name, folder, model_type, capsys):
    """The published configs (bench/model_configs/) at the recipe's settings fit 8 x 80 GB as placed."""
    from rlrunner.commands.plan import main

    overrides = [f"env.{split}.dataset.path=examples/diffusion/data/tiny_ocr" for split in ("train", "eval")]
    assert main([name, f"actor.model.model_path=bench/model_configs/{folder}", "actor.model.model_type=auto",
                 "cluster.num_devices_per_node=8", *overrides, "--device-memory", "80"]) == 0
    out = capsys.readouterr().out
    assert f": {model_type} from " in out and "8 device(s)" in out
    assert "--device-memory: fits" in out and "DOES NOT FIT" not in out
