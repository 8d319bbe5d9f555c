"""FLUX.2-klein's own rules: LoRA on the fused single blocks, the schedule by token and step count, the batch-norm
de-normalisation before decoding, and the step-distilled variant's guidance read from its folder."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
import torch
from family_helpers import make_noise, pipeline_pixels, pipeline_sample

from rlrunner.models import EMA_ADAPTER, TRAINED_ADAPTER

PROMPTS = ['a sign that says "open"', "a cat"]


def _perturbed(model):
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.adapter_parameters(EMA_ADAPTER):
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def test_lora_covers_the_single_blocks_and_they_train(load_tiny):
    """Every single block's fused qkv+MLP input and output projection carries the adapter and gets a gradient."""
    model = load_tiny("flux2_klein")
    adapted = {name for name, module in model.transformer.named_modules() if hasattr(module, "lora_A")}
    for i in range(len(model.transformer.single_transformer_blocks)):
        assert {f"single_transformer_blocks.{i}.attn.to_qkv_mlp_proj",
                f"single_transformer_blocks.{i}.attn.to_out"} <= adapted
    assert "transformer_blocks.0.attn.to_out.0" in adapted and "transformer_blocks.0.attn.to_out" not in adapted
    with torch.no_grad():
        for p in model.adapter_parameters(TRAINED_ADAPTER):
            p.add_(0.1)  # non-zero B, so that lora_A gets a gradient too
    cond = model.encode_prompts(PROMPTS)
    model.velocity(torch.randn(2, *model.latent_shape), torch.tensor([0.9, 0.3]), cond).pow(2).mean().backward()
    single = [(n, p) for n, p in model.transformer.named_parameters()
              if n.startswith("single_transformer_blocks") and f".{TRAINED_ADAPTER}." in n]
    assert len(single) == 4 * len(model.transformer.single_transformer_blocks)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for _, p in single)


def test_schedule_depends_on_token_count_and_step_count(load_tiny):
    """sigma = e^mu / (e^mu + 1/s - 1) on s = linspace(1, 1/N, N), mu from the pipeline's empirical fit: at 64 tokens
    and 2 steps mu = 1.96440 and sigma(1/2) = 0.87701 (by hand); 4 steps move the same point, 96 tokens too."""
    model = load_tiny("flux2_klein")
    assert model.shapes.image_tokens == 64
    torch.testing.assert_close(model.sigmas(2), torch.tensor([1.0, 0.87701, 0.0]), atol=1e-5, rtol=0)
    m_200, m_10 = 0.00016927 * 64 + 0.45666666, 8.73809524e-05 * 64 + 1.89833333
    mu_4 = (m_200 - m_10) / 190 * 4 + m_200 - 200 * (m_200 - m_10) / 190
    expected = math.exp(mu_4) / (math.exp(mu_4) + 1 / 0.5 - 1)
    assert model.sigmas(4)[2].item() == pytest.approx(expected, abs=1e-6) and abs(expected - 0.87701) > 1e-3
    wide = load_tiny("flux2_klein", resolution=[32, 48])
    assert wide.shapes.image_tokens == 96 and abs(wide.sigmas(2)[1].item() - 0.87701) > 1e-4


def test_second_resolution_rollout_and_pixels_equal_the_pipeline(load_tiny):
    """At 32x48 (96 tokens) the rollout equals Flux2KleinPipeline's, and decoding (batch-norm de-normalisation with
    the VAE's running statistics, unpatchify, VAE) gives the pipeline's pixels."""
    model = _perturbed(load_tiny("flux2_klein", resolution=[32, 48]))
    assert model.latent_shape == (16, 8, 12)
    assert not torch.allclose(model.vae.bn.running_mean, torch.zeros(16))  # the statistics are exercised
    cond = model.encode_prompts(PROMPTS)
    noise = make_noise(model, 2, torch.Generator().manual_seed(3))
    ours = model.sample(cond, noise, sampler="euler", num_steps=2)
    torch.testing.assert_close(ours, pipeline_sample(model, cond, noise, num_steps=2), atol=1e-5, rtol=1e-5)
    guided = model.sample(cond, noise, sampler="euler", num_steps=2, guidance_scale=4.0)
    theirs = pipeline_sample(model, cond, noise, num_steps=2, guidance_scale=4.0)
    torch.testing.assert_close(guided, theirs, atol=1e-5, rtol=1e-5)
    assert np.abs(model.decode(ours).astype(int) - pipeline_pixels(model, cond, noise, num_steps=2)).max() <= 1


def test_step_distilled_folder_samples_without_guidance(tiny_dirs, load_tiny, tmp_path):
    """A folder whose model_index.json says is_distilled (FLUX.2-klein-4B / 9B) loads with guidance auto as none;
    cfg on it is refused, and a guidance scale is refused at sampling."""
    distilled = tmp_path / "klein-distilled"
    shutil.copytree(tiny_dirs("flux2_klein"), distilled)
    index_file = distilled / "model_index.json"
    index_file.write_text(json.dumps({**json.loads(index_file.read_text()), "is_distilled": True}))
    assert load_tiny("flux2_klein").guidance == "cfg"
    model = load_tiny("flux2_klein", path=distilled)
    assert model.guidance == "none"
    with pytest.raises(ValueError, match="guidance=cfg on a step-distilled klein"):
        load_tiny("flux2_klein", path=distilled, guidance="cfg")
    with pytest.raises(ValueError, match="guidance=none"):
        model.sample(model.encode_prompts(PROMPTS), make_noise(model, 2), sampler="euler", num_steps=2,
                     guidance_scale=4.0)
