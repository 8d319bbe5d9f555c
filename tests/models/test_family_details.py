"""What differs between the families: Wan frames and timesteps, Qwen's optional mask, precision, memory options."""

from __future__ import annotations

import pytest
import torch
from family_helpers import make_noise

from rlrunner.models import EMA_ADAPTER, TRAINED_ADAPTER, build_model
from rlrunner.models.base import FlowModel
from rlrunner.models.wan import latent_num_frames

WAN = "wan22_ti2v_5b"


# ------------------------------------------------------------------------------------------------------- Wan
@pytest.mark.parametrize(("num_frames", "latent_frames"), [(1, 1), (5, 2), (9, 3), (121, 31)])
def test_wan_latent_frame_count(num_frames, latent_frames):
    assert latent_num_frames(num_frames) == latent_frames


@pytest.mark.parametrize("num_frames", [0, 4, 6])
def test_wan_num_frames_must_be_4k_plus_1(num_frames):
    with pytest.raises(ValueError, match="4k \\+ 1"):
        latent_num_frames(num_frames)


@pytest.mark.parametrize(("num_frames", "pixels_shape"), [(1, (2, 32, 32, 3)), (9, (2, 9, 32, 32, 3))])
def test_wan_video_and_image_modes(load_tiny, num_frames, pixels_shape):
    model = load_tiny(WAN, num_frames=num_frames)
    assert model.latent_shape == (48, latent_num_frames(num_frames), 2, 2)
    assert model.is_video == (num_frames > 1)
    x0 = model.sample(model.encode_prompts(["a", "b"]), make_noise(model, 2), sampler="euler", num_steps=2)
    assert model.decode(x0).shape == pixels_shape


def test_wan_expands_timesteps_per_token(load_tiny):
    model = load_tiny(WAN, num_frames=9)
    assert model.expand_timesteps  # from the pipeline config (Wan2.2 TI2V)
    latents = torch.zeros(2, *model.latent_shape)  # [2, 48, 3, 2, 2] -> 3 * 1 * 1 patch tokens
    timestep = model.transformer_timestep(torch.tensor([0.25, 1.0]), latents)
    assert timestep.shape == (2, 3)
    assert torch.equal(timestep, torch.tensor([[250.0] * 3, [1000.0] * 3]))
    model.expand_timesteps = False
    assert model.transformer_timestep(torch.tensor([0.25, 1.0]), latents).shape == (2,)


def test_wan_rejects_unsupported_settings(load_tiny):
    with pytest.raises(ValueError, match="condition_mode 'i2v'"):
        load_tiny(WAN, condition_mode="i2v")
    with pytest.raises(ValueError, match="divisible by 32.*nearest valid: 32x32"):
        load_tiny(WAN, resolution=[40, 24])


# ------------------------------------------------------------------------------------------------ Qwen-Image
def test_qwen_mask_is_none_unless_something_is_padded(load_tiny):
    model = load_tiny("qwen_image")
    seen = []
    model.transformer.register_forward_pre_hook(
        lambda _m, _a, kwargs: seen.append(kwargs["encoder_hidden_states_mask"]), with_kwargs=True)
    ragged = model.encode_prompts(["a", "a much longer prompt"])
    assert ragged["prompt_mask"].dtype == torch.long and not ragged["prompt_mask"].all()
    same = model.encode_prompts(["ab", "cd"])
    assert same["prompt_mask"].all()
    x, t = torch.randn(2, *model.latent_shape), torch.tensor([0.5, 0.5])
    with torch.no_grad():
        model.velocity(x, t, ragged)
        model.velocity(x, t, same)
    assert seen[0] is not None and seen[1] is None
    both = model.concat_cond([same, ragged])  # CFG halves / batches with different text lengths
    assert both["prompt_embeds"].shape[:2] == both["prompt_mask"].shape == (4, ragged["prompt_mask"].shape[1])


def test_qwen_guidance_rescales_each_packed_token_to_the_conditional_norm(load_tiny):
    """``true_cfg_scale`` by hand on two 2x2-patch tokens ([1, 4, 2, 4] latents), g = 2: token 0 has
    v_cond = e1, v_neg = e2, so v = 2 e1 - e2 rescaled to norm 1; token 1 has v_cond = 0, v_neg = e1, so 0."""
    model = load_tiny("qwen_image")
    v_cond, v_neg = torch.zeros(1, 4, 2, 4), torch.zeros(1, 4, 2, 4)
    v_cond[0, 0, 0, 0] = 1.0  # token 0 (columns 0-1), channel 0
    v_neg[0, 1, 0, 0] = 1.0  # token 0, channel 1
    v_neg[0, 0, 1, 3] = 1.0  # token 1 (columns 2-3), channel 0
    expected = torch.zeros(1, 4, 2, 4)
    expected[0, 0, 0, 0], expected[0, 1, 0, 0] = 2 / 5**0.5, -1 / 5**0.5
    torch.testing.assert_close(model.combine_guidance(v_neg, v_cond, 2.0), expected)
    plain = FlowModel.combine_guidance(model, v_neg, v_cond, 2.0)
    assert plain[0, 0, 1, 3] == -1.0  # the base rule (SD3, Wan) leaves it unscaled


# ------------------------------------------------------------------------------------------ precision, memory
def test_bf16_base_keeps_float32_lora(load_tiny):
    model = load_tiny("sd3", dtype=torch.bfloat16)
    base = [p for n, p in model.transformer.named_parameters() if "lora_" not in n]
    assert {p.dtype for p in base} == {torch.bfloat16}
    assert {p.dtype for p in model.trainable_parameters()} == {torch.float32}
    cond = model.encode_prompts(["a", "b"])
    assert cond["prompt_embeds"].dtype == torch.bfloat16
    x0 = model.sample(cond, make_noise(model, 2), sampler="dpm2", num_steps=2)
    assert x0.dtype == torch.float32 and torch.isfinite(x0).all()
    v = model.velocity(x0, torch.tensor([0.5, 0.5]), cond, TRAINED_ADAPTER)
    v.float().pow(2).mean().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.trainable_parameters())


def test_gradient_checkpointing_gives_the_same_gradients(load_tiny):
    grads = []
    for checkpointing in (False, True):
        model = load_tiny("sd3", gradient_checkpointing=checkpointing)
        with torch.no_grad():
            for p in model.adapter_parameters(TRAINED_ADAPTER):
                p.fill_(0.05)
        cond = model.encode_prompts(["a", "b"])
        x = torch.randn(2, *model.latent_shape, generator=torch.Generator().manual_seed(0))
        model.velocity(x, torch.tensor([0.3, 0.8]), cond).pow(2).mean().backward()
        grads.append([p.grad.clone() for p in model.trainable_parameters()])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads, strict=True))
    # backward would recompute the blocks with `default` active: other adapters only without a graph
    with pytest.raises(RuntimeError, match="torch.no_grad"):
        model.velocity(x, torch.tensor([0.3, 0.8]), cond, EMA_ADAPTER)


def test_offload_options_and_released_components(load_tiny):
    model = load_tiny("sd3", offload_text_encoder=True, offload_vae=True)
    cond = model.encode_prompts(["a", "b"])
    assert all(next(m.parameters()).device.type == "cpu" for m in model.text_encoders.values())
    x0 = model.sample(cond, make_noise(model, 2), sampler="euler", num_steps=2)
    assert model.decode(x0).shape == (2, 16, 16, 3)
    model.release_text_encoders()
    model.release_vae()
    assert model.pipe.text_encoder_3 is None and model.pipe.vae is None
    with pytest.raises(RuntimeError, match="released"):
        model.encode_prompts(["a"])
    with pytest.raises(RuntimeError, match="released"):
        model.decode(x0)
    # the denoiser and its adapters keep working from precomputed conditioning
    assert model.sample(cond, make_noise(model, 2), sampler="euler", num_steps=2, adapter=EMA_ADAPTER).shape == x0.shape


def test_build_model_from_the_recipe_section(tiny_dirs):
    from omegaconf import OmegaConf

    from rlrunner.recipe import ModelConfig

    cfg = OmegaConf.structured(ModelConfig(model_type="sd3", model_path=str(tiny_dirs("sd3")), precision="bf16",
                                           device="cpu"))
    cfg.sd3.merge_with({"resolution": 16, "max_sequence_length": 8, "lora_rank": 4, "lora_alpha": 8})
    model = build_model(cfg)
    assert type(model).__name__ == "SD3FlowModel" and model.dtype == torch.float32  # half precision -> fp32 on CPU
    assert model.latent_shape == (4, 8, 8)
