"""What FLUX.1 adds to the FlowModel contract: the token-count schedule, embedded / none / cfg guidance by variant,
model_type auto for dev and schnell folders, and the one-line refusals before any worker starts."""

from __future__ import annotations

import json
import logging
import math
import re
import warnings
from pathlib import Path

import pytest
import torch
from family_helpers import make_noise, pipeline_sample
from omegaconf import OmegaConf

from rlrunner.config.loader import RecipeError
from rlrunner.config.schema import AlgorithmConfig
from rlrunner.distributed.parallelize import Engine
from rlrunner.models import EMA_ADAPTER, TRAINED_ADAPTER, detect_model_type
from rlrunner.models.flux1 import Flux1FlowModel
from rlrunner.models.schedules import token_shift_mu
from rlrunner.models.settings import FamilyConfig
from rlrunner.objectives import MicroBatch, build_objective
from rlrunner.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[2]
FLUX1_DEV = ROOT / "bench" / "model_configs" / "flux.1-dev"  # the published configs, scheduler included
PROMPTS = ['a sign that says "open"', "a cat"]


def _published(name: str) -> dict:
    file = "scheduler_config.json" if name == "scheduler" else "config.json"
    return json.loads((FLUX1_DEV / name / file).read_text())


def _perturbed(model):
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.adapter_parameters(EMA_ADAPTER):
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model


@pytest.mark.parametrize(("pixels", "tokens", "mu"), [(512, 1024, 0.63), (1024, 4096, 1.15)])
def test_flux1_dev_shift_by_token_count_matches_the_published_config(pixels, tokens, mu):
    """mu = 0.5 + (tokens - 256) * 0.65 / 3840 with FLUX.1-dev's scheduler config; the sigma shift is exp(mu):
    1.878 at 512 px, 3.158 at 1024 px."""
    family_cfg = OmegaConf.structured(FamilyConfig(resolution=pixels, max_sequence_length=512, guidance_scale=3.5))
    shapes = Flux1FlowModel.sample_shapes(family_cfg, {n: _published(n) for n in ("transformer", "vae")})
    assert shapes.latent == (16, pixels // 8, pixels // 8) and shapes.image_tokens == tokens
    assert token_shift_mu(_published("scheduler"), tokens) == pytest.approx(mu, abs=1e-12)
    assert math.exp(mu) == pytest.approx({512: 1.878, 1024: 3.158}[pixels], abs=1e-3)


def test_schedule_follows_the_image_token_count(load_tiny):
    """Sigmas linspace(1, 1/N, N) shifted by exp(mu): t' = e^mu / (e^mu + 1/t - 1), then 0; mu by token count."""
    for resolution, tokens in ((16, 16), (64, 256)):
        model = load_tiny("flux1", resolution=resolution)
        assert model.shapes.image_tokens == tokens
        shift = math.exp(0.5 + (tokens - 256) * 0.65 / 3840)
        expected = [shift / (shift + 1 / t - 1) for t in (1.0, 0.75, 0.5, 0.25)] + [0.0]
        torch.testing.assert_close(model.sigmas(4), torch.tensor(expected), atol=1e-6, rtol=0)


def test_embedded_guidance_rollout_equals_the_pipeline_at_a_second_resolution(load_tiny):
    """64 px = 256 tokens (mu 0.5) beside the contract's 16 px = 16 tokens: the pipeline's schedule moves with it."""
    model = _perturbed(load_tiny("flux1", resolution=64))
    assert model.guidance == "embedded"
    cond = model.encode_prompts(PROMPTS)
    noise = make_noise(model, 2, torch.Generator().manual_seed(3))
    ours = model.sample(cond, noise, sampler="euler", num_steps=2, guidance_scale=3.5)
    theirs = pipeline_sample(model, cond, noise, num_steps=2, guidance_scale=3.5)
    torch.testing.assert_close(ours, theirs.float(), atol=1e-5, rtol=1e-5)


def test_schnell_folder_samples_without_guidance_on_the_plain_grid(load_tiny, tiny_flux1_schnell_dir):
    model = load_tiny("flux1", path=tiny_flux1_schnell_dir)
    assert model.guidance == "none"  # guidance: auto on a transformer without guidance embedding
    torch.testing.assert_close(model.sigmas(2), torch.tensor([1.0, 0.5, 0.0]))  # use_dynamic_shifting off
    cond = model.encode_prompts(PROMPTS)
    noise = make_noise(model, 2, torch.Generator().manual_seed(4))
    ours = _perturbed(model).sample(cond, noise, sampler="euler", num_steps=2)
    torch.testing.assert_close(ours, pipeline_sample(model, cond, noise, num_steps=2).float(), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="guidance_scale=3.0 on a model sampled without guidance"):
        model.sample(cond, noise, sampler="euler", num_steps=2, guidance_scale=3.0)


def test_true_cfg_rollout_equals_the_pipeline(load_tiny, tiny_flux1_schnell_dir):
    """guidance: cfg is the pipeline's true_cfg_scale with the negative prompt (two passes, plain combination)."""
    model = _perturbed(load_tiny("flux1", path=tiny_flux1_schnell_dir, guidance="cfg", negative_prompt="blurry"))
    cond = model.encode_prompts(PROMPTS)
    noise = make_noise(model, 2, torch.Generator().manual_seed(5))
    ours = model.sample(cond, noise, sampler="euler", num_steps=2, guidance_scale=4.0)
    theirs = pipeline_sample(model, cond, noise, num_steps=2, guidance_scale=4.0)
    torch.testing.assert_close(ours, theirs.float(), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ours, model.sample(cond, noise, sampler="euler", num_steps=2))


def test_saved_adapter_loads_into_flux_pipeline_without_unexpected_or_missing_keys(load_tiny, tmp_path):
    """diffusers' FluxPipeline.load_lora_weights takes every tensor of our file (its logger and peft's warnings would
    name unexpected or missing keys) and the pipeline's output moves with it."""
    from diffusers.utils import logging as diffusers_logging

    model = load_tiny("flux1")
    with torch.no_grad():
        for p in model.adapter_parameters(TRAINED_ADAPTER):
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    model.save_lora(str(tmp_path / "lora"))
    plain = load_tiny("flux1", use_lora=False)
    cond = plain.encode_prompts(PROMPTS)
    noise = make_noise(plain, 2, torch.Generator().manual_seed(6))
    before = pipeline_sample(plain, cond, noise, num_steps=2, adapter=None)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = diffusers_logging.get_logger("diffusers")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plain.pipe.load_lora_weights(str(tmp_path / "lora"))
    finally:
        logger.removeHandler(handler)
    messages = [r.getMessage() for r in records] + [str(w.message) for w in caught]
    assert not [m for m in messages if re.search(r"(unexpected|missing) keys?", m, re.IGNORECASE)], messages
    assert not torch.allclose(pipeline_sample(plain, cond, noise, num_steps=2, adapter=None), before)


def test_flow_grpo_rollout_and_loss_see_the_same_embedded_guidance(load_tiny):
    """FlowGRPO's first pass recomputes the rollout's log-probabilities (ratio 1) on FLUX.1-dev at guidance 3.5: the
    SDE rollout and the loss's velocity both feed the recipe's scale to the transformer."""
    model = load_tiny("flux1", train_sampler="euler", guidance_scale=3.5)
    with torch.no_grad():
        for p in model.adapter_parameters(TRAINED_ADAPTER):
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    alg = OmegaConf.structured(AlgorithmConfig(name="flow_grpo", flow_grpo_timestep_fraction=0.5))
    objective = build_objective(alg, model.cfg, model.resolved_guidance)
    cond = model.encode_prompts(PROMPTS)
    noise = make_noise(model, 2, torch.Generator().manual_seed(7))
    with torch.no_grad():
        x0, kept = objective.rollout(model, cond, noise, torch.Generator().manual_seed(3))
    micro = MicroBatch({"x0": x0, "advantages": torch.tensor([1.0, -1.0]), **kept}, cond, [], 0)
    _, metrics = objective.loss(model, Engine(model), micro)
    assert metrics["approx_kl"] < 1e-10 and metrics["clip_frac"] == 0.0


def test_model_type_auto_picks_flux1_for_dev_and_schnell_folders(tiny_dirs, tiny_flux1_schnell_dir):
    assert detect_model_type(str(tiny_dirs("flux1"))) == "flux1"
    assert detect_model_type(str(tiny_flux1_schnell_dir)) == "flux1"
    assert detect_model_type(str(FLUX1_DEV)) == "flux1"


# ------------------------------------------------------------------------------- refused before any worker starts
def _recipe(*overrides: str):
    tiny_data = [f"env.{split}.dataset.path=examples/diffusion/data/tiny_ocr" for split in ("train", "eval")]
    return load_recipe("flux1_dev_nft_ocr", [*tiny_data, *overrides])


@pytest.fixture
def _from_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.mark.usefixtures("_from_repo_root")
@pytest.mark.parametrize(("folder", "overrides", "message"), [
    ("sd3", [], r"holds a StableDiffusion3Pipeline pipeline, but model_type 'flux1' expects a FluxPipeline"),
    ("schnell", [], r"samples without guidance \(guidance_embeds: false, guidance none\), but guidance_scale=3.5"),
    ("schnell", ["actor.model.flux1.guidance=embedded"],
     r"guidance='embedded' but this FLUX.1 transformer has no guidance embedding .*use auto or none or cfg"),
    ("dev", ["actor.model.flux1.guidance=cfg"],
     r"guidance='cfg' but this FLUX.1 transformer has guidance embedding .*use auto or embedded"),
    ("dev", ["actor.model.flux1.resolution=14"], r"flux1 resolution 14x14 must be divisible by 4 .*nearest valid: 16x16"),
    ("published", ["actor.model.flux1.resolution=520"], r"must be divisible by 16 .*nearest valid: 512x512"),
])
def test_bad_flux1_recipes_fail_with_one_line(tiny_dirs, tiny_flux1_schnell_dir, folder, overrides, message):
    path = {"sd3": tiny_dirs("sd3"), "schnell": tiny_flux1_schnell_dir, "dev": tiny_dirs("flux1"),
            "published": FLUX1_DEV}[folder]
    with pytest.raises(RecipeError, match=message) as err:
        _recipe(f"actor.model.model_path={path}", *overrides)
    assert "\n" not in str(err.value)


@pytest.mark.usefixtures("_from_repo_root")
def test_a_schnell_folder_loads_with_auto_and_guidance_scale_1(tiny_flux1_schnell_dir):
    cfg = _recipe(f"actor.model.model_path={tiny_flux1_schnell_dir}", "actor.model.model_type=auto",
                  "actor.model.flux1.guidance_scale=1.0", "actor.model.flux1.eval_guidance_scale=1.0")
    assert cfg.actor.model.model_type == "flux1"
