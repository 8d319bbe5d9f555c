"""RLinf's recipes load as they are: hydra defaults lists, interpolation, RLinf keys mapped, ignored or refused."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import yaml

from rlrunner.config.errors import RecipeError
from rlrunner.config.loader import CONFIG_DIR, available_recipes
from rlrunner.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
RLINF = ROOT / "tests/fixtures/rlinf"
RECIPES = ("sd3_nft_ocr", "wan22_ti2v_5b_nft_ocr", "wan22_ti2v_5b_nft_video_ocr")


@pytest.fixture
def assets(tmp_path: Path, monkeypatch) -> list[str]:
    """Overrides pointing RLinf's placeholder paths at real folders (nothing is read from them here)."""
    (tmp_path / "model").mkdir()
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}.txt").write_text('a sign that says "2345"\n')
    monkeypatch.chdir(tmp_path)
    return [f"actor.model.model_path={tmp_path / 'model'}", f"env.train.dataset.path={data}",
            f"env.eval.dataset.path={data}"]


@pytest.fixture
def rlinf_env(monkeypatch) -> None:
    """The variables RLinf's run scripts export; its recipes' hydra.searchpath reads them."""
    monkeypatch.setenv("REPO_PATH", str(RLINF))
    monkeypatch.setenv("DIFFUSION_PATH", str(RLINF / "examples/diffusion"))


def _write(root: Path, files: dict[str, dict]) -> None:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(yaml.safe_dump(content))


def test_defaults_go_to_their_packages_in_order_and_the_recipe_wins(tmp_path, assets):
    base = yaml.safe_load((CONFIG_DIR / "tiny_nft_ocr.yaml").read_text())
    _write(tmp_path / "config", {
        "optim/fast.yaml": {"lr": 0.5, "weight_decay": 0.25},
        "optim/slow.yaml": {"lr": 0.125, "weight_decay": 0.0625},
        "family/tiny.yaml": {"negative_prompt": "blurry"},
        "recipe.yaml": {**base, "defaults": ["optim/fast@actor.optim", {"family@actor.model.tiny": "tiny"},
                                              {"override optim@actor.optim": "slow"},
                                              {"override hydra/job_logging": "stdout"}],
                        "actor": {**base["actor"], "optim": {"lr": 0.375}}},
        "self_last.yaml": {**base, "defaults": ["_self_", "optim/fast@actor.optim"],
                           "actor": {**base["actor"], "optim": {"lr": 0.375}}},
    })
    cfg = load_recipe(str(tmp_path / "config/recipe.yaml"), assets)
    # slow replaced fast; the recipe's own lr wins over its defaults (Hydra >= 1.1: _self_ last)
    assert (cfg.actor.optim.lr, cfg.actor.optim.weight_decay) == (0.375, 0.0625)
    assert cfg.actor.model.tiny.negative_prompt == "blurry"
    assert cfg.runner.logger.experiment_name == base["runner"]["logger"].get("experiment_name", "recipe")
    cfg = load_recipe(str(tmp_path / "config/self_last.yaml"), assets)
    assert (cfg.actor.optim.lr, cfg.actor.optim.weight_decay) == (0.5, 0.25)  # _self_ first: the default wins


def test_interpolations_and_oc_env_resolve(tmp_path, assets, monkeypatch):
    base = yaml.safe_load((CONFIG_DIR / "tiny_nft_ocr.yaml").read_text())
    base["runner"]["logger"]["experiment_name"] = "${oc.env:SWEEP_NAME}-lr${actor.optim.lr}"
    _write(tmp_path / "config", {"r.yaml": base})
    monkeypatch.setenv("SWEEP_NAME", "sweep7")
    cfg = load_recipe(str(tmp_path / "config/r.yaml"), [*assets, "actor.optim.lr=0.25"])
    assert cfg.runner.logger.experiment_name == "sweep7-lr0.25"


def test_rlinf_defaults_resolve_through_hydra_searchpath_or_name_the_missing_file(assets, rlinf_env, monkeypatch):
    recipe = str(RLINF / "examples/diffusion/config/sd3_nft_ocr.yaml")
    assert load_recipe(recipe, assets).actor.strategy == "fsdp2"  # hybrid_engines/ found in REPO_PATH's embodiment
    monkeypatch.delenv("REPO_PATH")
    with pytest.raises(RecipeError, match=r"defaults entry 'hybrid_engines/fsdp' needs hybrid_engines/fsdp.yaml, "
                                          r"found in none of .*; copy it there"):
        load_recipe(recipe, assets)


def test_rlinf_sd3_recipe_maps_onto_our_keys(assets, rlinf_env, caplog):
    with caplog.at_level(logging.WARNING, logger="rlrunner"):
        cfg = load_recipe(str(RLINF / "examples/diffusion/config/sd3_nft_ocr.yaml"), assets)
    sd3 = cfg.actor.model.sd3
    assert cfg.actor.model.model_type == "sd3" and cfg.actor.model.precision == "bf16"  # model/sd3 + param_dtype
    assert cfg.actor.strategy == "fsdp2" and sd3.gradient_checkpointing is True  # actor.fsdp_config
    assert cfg.cluster.enable_offload is True  # rollout.enable_offload: true
    assert (sd3.resolution, sd3.num_steps, sd3.eval_num_steps, sd3.train_sampler, sd3.eval_sampler) == (
        512, 10, 40, "dpm2", "euler")  # RLinf's eval_sampler ode is Euler here
    assert (sd3.guidance_scale, sd3.lora_rank, sd3.lora_alpha, sd3.lora_path) == (1.0, 32, 64, "")
    assert (sd3.offload_text_encoder, sd3.offload_vae) == (False, False)  # the recipe's offload_auxiliary_modules
    results = Path.cwd().parent / "results"  # the recipe's ../results, made absolute on the driver
    for split in ("train", "eval"):
        env = cfg.env[split]
        assert (env.dataset.type, env.reward.model, env.reward.use_gpu) == ("ocr", "ocr", False)
        assert env.video_cfg.video_base_dir == str(results / "video/ocr_reward")  # ${runner.logger.log_path}/...
    assert (cfg.env.train.total_num_envs, cfg.env.train.rollout_epoch, cfg.env.eval.total_num_envs) == (192, 6, 128)
    run = cfg.runner
    assert (run.max_steps, run.max_epochs, run.val_check_interval, run.save_interval) == (-1, 70, -1, -1)
    assert (run.resume_dir, run.logger.experiment_name, run.logger.log_path) == ("", "sd3_nft_ocr", str(results))
    alg = cfg.algorithm
    assert (alg.name, alg.group_size, alg.adv_type, alg.nft_beta, alg.adv_clip_max) == ("nft", 24, "grpo", 0.1, 5.0)
    assert list(alg.nft_tau) == [1.0, 0.01, 30, 70] and alg.nft_clip_ratio is None
    assert (cfg.actor.micro_batch_size, cfg.actor.global_batch_size, cfg.actor.optim.lr) == (9, 576, 3e-4)
    (line,) = [r.getMessage() for r in caplog.records if "RLinf keys" in r.getMessage()]
    ignored = line.split(": ", 2)[-1].split(", ")
    assert {"runner.task_type", "algorithm.kl_penalty", "weight_syncer", "hydra", "env.<split>.seed",
            "actor.fsdp_config.reshard_after_forward", "algorithm.recompute_v"} <= set(ignored)
    assert len(ignored) == len(set(ignored))  # each once, though env.train and env.eval both carry them


def test_rlinf_wan_recipes_map_clip_ratio_video_and_rewards(assets, rlinf_env):
    image = load_recipe(str(RLINF / "examples/diffusion/config/wan22_ti2v_5b_nft_ocr.yaml"), assets)
    video = load_recipe(str(RLINF / "examples/diffusion/config/wan22_ti2v_5b_nft_video_ocr.yaml"), assets)
    assert image.algorithm.nft_clip_ratio == 0.1 and image.actor.optim.lr == 4e-4
    assert list(image.actor.model.wan22_ti2v_5b.resolution) == [512, 512]
    family = video.actor.model.wan22_ti2v_5b
    assert (family.num_frames, video.algorithm.adv_type, video.algorithm.advantage_mode) == (5, "grpo_video", "video")
    assert (video.env.train.reward.model, video.env.train.reward.frame_interval) == ("video_ocr", 4)
    assert video.env.eval.reward.use_gpu is True


@pytest.mark.parametrize(("override", "message"), [
    ("algorithm.nft_loss_form=dpo", r"nft_loss_form='dpo' is an RLinf setting rlrunner does not implement; it supports 'mse'"),
    ("algorithm.nft_energy_reduction=sum", r"algorithm.nft_energy_reduction='sum' .* it supports 'mean'"),
    ("algorithm.recompute_v=true", r"algorithm.recompute_v=True .* it supports False"),
    ("algorithm.update_epoch=2", r"algorithm.update_epoch=2 .* it supports 1"),
    ("actor.fsdp_config.sharding_strategy=hybrid_shard", r"sharding_strategy='hybrid_shard'.* use full_shard or no_sh"),
    ("actor.model.sd3.cfg=true", r"actor.model.sd3.cfg=True with actor.model.sd3.guidance_scale=1.0"),
    ("rollout.model.model_path=/elsewhere", r"rollout.model.model_path='/elsewhere' differs from actor.model"),
    ("env.train.group_size=16", (r"^env.train.group_size=16 differs from what it means here \(algorithm.group_size=24 "
                                 r"sets the group\); set env.train.group_size=24 or drop it$")),
    ("env.eval.group_size=24", (r"env.eval.group_size=24 differs from what it means here \(rlrunner's eval samples "
                                r"each held-out prompt once\); set env.eval.group_size=1")),
])
def test_rlinf_settings_we_do_not_compute_are_refused_naming_the_key(assets, rlinf_env, override, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe(str(RLINF / "examples/diffusion/config/sd3_nft_ocr.yaml"), [*assets, override])


def test_rlinf_group_sizes_that_agree_with_ours_are_accepted(assets, rlinf_env):
    recipe = str(RLINF / "examples/diffusion/config/sd3_nft_ocr.yaml")  # train: ${algorithm.group_size}, eval: 1
    assert load_recipe(recipe, assets).algorithm.group_size == 24
    cfg = load_recipe(recipe, [*assets, "algorithm.group_size=12", "env.train.group_size=12", "env.eval.group_size=1"])
    assert cfg.algorithm.group_size == 12


def test_rlinf_keys_given_as_overrides_are_mapped_too(assets, rlinf_env):
    recipe = str(RLINF / "examples/diffusion/config/sd3_nft_ocr.yaml")
    cfg = load_recipe(recipe, [*assets, "actor.fsdp_config.sharding_strategy=no_shard",
                               "actor.fsdp_config.mixed_precision.param_dtype=float32",
                               "actor.fsdp_config.gradient_checkpointing=false",
                               "actor.model.sd3.offload_auxiliary_modules=true"])
    assert cfg.actor.strategy == "ddp" and cfg.actor.model.precision == "fp32"
    assert cfg.actor.model.sd3.gradient_checkpointing is False
    assert (cfg.actor.model.sd3.offload_text_encoder, cfg.actor.model.sd3.offload_vae) == (True, True)


def test_misspelt_keys_still_name_the_nearest_valid_key(assets, rlinf_env, tmp_path):
    recipe = str(RLINF / "examples/diffusion/config/sd3_nft_ocr.yaml")
    with pytest.raises(RecipeError, match=r"unknown key 'actor.optim.lrr' \(did you mean 'actor.optim.lr'\?\)"):
        load_recipe(recipe, [*assets, "actor.optim.lrr=1e-4"])
    text = (RLINF / "examples/diffusion/config/sd3_nft_ocr.yaml").read_text()
    config = shutil.copytree(RLINF / "examples/diffusion/config", tmp_path / "config")
    (config / "typo.yaml").write_text(text.replace("nft_beta:", "nft_betta:"))
    with pytest.raises(RecipeError, match=r"unknown key 'algorithm.nft_betta' \(did you mean 'algorithm.nft_beta'"):
        load_recipe(str(config / "typo.yaml"), assets)


def test_our_recipes_have_no_rlinf_keys_to_report(caplog):
    with caplog.at_level(logging.WARNING, logger="rlrunner"):
        loaded = [load_recipe(name, check_datasets=False) for name in available_recipes()]
    assert len(loaded) >= 5
    assert not [r for r in caplog.records if "RLinf keys" in r.getMessage()]
