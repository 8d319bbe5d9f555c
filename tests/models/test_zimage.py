"""Z-Image's own rules: its guidance (``pos + (s - 1)(pos - neg)``, truncation, norm cap), its static-shift schedule,
and the Turbo variant (a folder that differs only in its scheduler's shift) loading with ``model_type: auto``."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from family_helpers import make_noise, pipeline_pixels, pipeline_sample

from rlrunner.models import EMA_ADAPTER, detect_model_type

PROMPTS = ['a sign that says "open"', "a cat"]


def _perturbed(model):
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.adapter_parameters(EMA_ADAPTER):
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def test_second_resolution_with_truncation_and_norm_cap_equals_the_pipeline(load_tiny):
    """At 16x24 the rollout and the decoded pixels equal ZImagePipeline's; with guidance 4, cfg_truncation 0.1
    (the second step, 1 - sigma = 1/7, runs unguided) and cfg_normalization 1.0 too, and both options matter."""
    model = _perturbed(load_tiny("zimage", resolution=[16, 24], cfg_truncation=0.1, cfg_normalization=1.0))
    assert model.latent_shape == (4, 8, 12)
    cond = model.encode_prompts(PROMPTS)
    noise = make_noise(model, 2, torch.Generator().manual_seed(3))
    plain = model.sample(cond, noise, sampler="euler", num_steps=2)
    torch.testing.assert_close(plain, pipeline_sample(model, cond, noise, num_steps=2), atol=1e-5, rtol=1e-5)
    assert np.abs(model.decode(plain).astype(int) - pipeline_pixels(model, cond, noise, num_steps=2)).max() <= 1
    guided = model.sample(cond, noise, sampler="euler", num_steps=2, guidance_scale=4.0)
    theirs = pipeline_sample(model, cond, noise, num_steps=2, guidance_scale=4.0)
    torch.testing.assert_close(guided, theirs, atol=1e-5, rtol=1e-5)
    model.cfg.cfg_truncation, model.cfg.cfg_normalization = 1.0, 0.0
    untruncated = model.sample(cond, noise, sampler="euler", num_steps=2, guidance_scale=4.0)
    assert not torch.allclose(untruncated, guided, atol=1e-3)


def test_guidance_rule_by_hand(load_tiny):
    """``pos + (s - 1)(pos - neg)``; each sample is scaled down to ``cfg_normalization`` x its conditional norm
    only when it exceeds it."""
    model = load_tiny("zimage", cfg_normalization=2.0)
    pos = torch.tensor([[0.0, 1.0], [3.0, 4.0]]).view(2, 2, 1, 1)
    neg = torch.tensor([[0.0, 0.0], [3.0, 4.0]]).view(2, 2, 1, 1)
    guided = model.combine_guidance(neg, pos, 5.0).view(2, 2)
    # sample 0: [0, 5] has norm 5 > 2 x 1: scaled to [0, 2]; sample 1: neg == pos, so [3, 4] stays (norm 5 <= 10)
    torch.testing.assert_close(guided, torch.tensor([[0.0, 2.0], [3.0, 4.0]]))
    model.cfg.cfg_normalization = 0.0
    torch.testing.assert_close(model.combine_guidance(neg, pos, 5.0).view(2, 2), torch.tensor([[0.0, 5.0], [3.0, 4.0]]))


def test_turbo_folder_loads_with_auto_and_samples_unguided_on_its_shift(tiny_dirs, load_tiny, tmp_path):
    """Z-Image-Turbo is a Z-Image folder whose scheduler shifts by 3.0 (base: 6.0), sampled without guidance: the
    sigmas at 2 steps are shift*s / (1 + (shift - 1) s) at s = 1/2, and the rollout equals the pipeline's at
    guidance_scale 0."""
    turbo = tmp_path / "z-image-turbo"
    shutil.copytree(tiny_dirs("zimage"), turbo)
    config_file = turbo / "scheduler" / "scheduler_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "shift": 3.0}))
    assert detect_model_type(str(turbo)) == "zimage"
    base = load_tiny("zimage")
    torch.testing.assert_close(base.sigmas(2), torch.tensor([1.0, 6 / 7, 0.0]))
    model = _perturbed(load_tiny("zimage", path=turbo, guidance="none"))
    torch.testing.assert_close(model.sigmas(2), torch.tensor([1.0, 0.75, 0.0]))
    cond = model.encode_prompts(PROMPTS)
    noise = make_noise(model, 2, torch.Generator().manual_seed(4))
    ours = model.sample(cond, noise, sampler="euler", num_steps=2)
    torch.testing.assert_close(ours, pipeline_sample(model, cond, noise, num_steps=2), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="guidance=none"):
        model.sample(cond, noise, sampler="euler", num_steps=2, guidance_scale=4.0)
