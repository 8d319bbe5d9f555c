"""bf16 rollouts equal their diffusers pipelines, family by family, on the tiny random-weight folders.

The fp32 "equals the pipeline" tests (test_model_families.py) cannot see a cast: in bf16 the FLUX and Qwen-Image
pipelines pass ``bf16(1000 sigma) / 1000`` (a quarter of sigmas one bf16 step away from ``bf16(sigma)``), and Wan's
pipeline under the folder's UniPC scheduler passes int64 ``1000 sigma``. So each denoiser call's timestep tensor is
compared exactly (dtype and values) with the pipeline's, and the rollout within bf16 tolerance (the pipeline keeps
its latents in bf16 between steps, we keep them in float32).
"""

from __future__ import annotations

import pytest
import torch
from family_helpers import make_noise, pipeline_sample

from rlrunner.models import EMA_ADAPTER

FAMILIES = ["sd3", "wan22_ti2v_5b", "wan21_t2v", "wan22_t2v_a14b", "qwen_image", "zimage", "flux2_klein", "flux1"]
PROMPTS = ['a sign that says "open"', "a cat"]
NUM_STEPS = 6  # enough sigmas that a wrong bf16 cast shows on some of them


def _record_timesteps(model) -> list[torch.Tensor]:
    """The timestep argument of every denoiser call, in call order (Z-Image takes it positionally)."""
    calls: list[torch.Tensor] = []
    for name in ("transformer", "transformer_2"):
        module = getattr(model.pipe, name, None)
        if module is not None:
            module.register_forward_pre_hook(
                lambda _m, args, kw: calls.append((kw["timestep"] if "timestep" in kw else args[1]).clone()),
                with_kwargs=True)
    return calls


@pytest.mark.parametrize("model_type", FAMILIES)
def test_bf16_euler_rollout_equals_its_pipeline(model_type, load_tiny):
    model = load_tiny(model_type, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.adapter_parameters(EMA_ADAPTER):
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    cond = model.encode_prompts(PROMPTS)
    noise = make_noise(model, len(PROMPTS), torch.Generator().manual_seed(5))
    calls = _record_timesteps(model)
    ours = model.sample(cond, noise, sampler="euler", num_steps=NUM_STEPS, adapter=EMA_ADAPTER)
    our_timesteps = list(calls)
    calls.clear()
    theirs = pipeline_sample(model, cond, noise, num_steps=NUM_STEPS, adapter=EMA_ADAPTER)
    assert len(our_timesteps) == len(calls) == NUM_STEPS
    for step, (mine, pipe) in enumerate(zip(our_timesteps, calls)):
        assert mine.dtype == pipe.dtype, f"step {step}: timestep dtype {mine.dtype}, the pipeline's {pipe.dtype}"
        assert torch.equal(mine, pipe), f"step {step}: timestep {mine.flatten()[:2]}, the pipeline's {pipe.flatten()[:2]}"
    torch.testing.assert_close(ours, theirs.float(), atol=5e-2, rtol=5e-2)
