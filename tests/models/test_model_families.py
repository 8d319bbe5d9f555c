"""The FlowModel contract, checked for every diffusers family on tiny random-weight pipelines loaded from disk."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from family_helpers import encode_prompt_batch, make_noise, pipeline_sample

from rlrunner.models import EMA_ADAPTER, TRAINED_ADAPTER

FAMILIES = ["sd3", "wan22_ti2v_5b", "qwen_image"]
FAMILIES += ["zimage"]
FAMILIES += ["flux2_klein"]
FAMILIES += ["flux1"]
FAMILIES += ["wan21_t2v", "wan22_t2v_a14b"]
PROMPTS = ['a sign that says "open"', "a cat", 'the word "rl" on a wall']


@pytest.fixture(params=FAMILIES)
def model_type(request) -> str:
    return request.param


@pytest.fixture
def model(model_type, load_tiny):
    return load_tiny(model_type)


def _noise(model, batch: int, seed: int) -> torch.Tensor:
    return make_noise(model, batch, torch.Generator().manual_seed(seed))


def _perturb(model, adapter: str = TRAINED_ADAPTER, seed: int = 0) -> None:
    """Give ``adapter`` non-zero LoRA weights (gaussian init leaves B = 0, i.e. the base model)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.adapter_parameters(adapter):
            p.add_(0.3 * torch.randn(p.shape, generator=gen))


def _inputs(model, seed: int = 1):
    cond = model.encode_prompts(PROMPTS)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((len(PROMPTS), *model.latent_shape), generator=gen)
    t = torch.tensor([0.9, 0.5, 0.2])
    return x, t, cond


def test_sampling_shapes_and_seed_determinism(model):
    cond = model.encode_prompts(PROMPTS)
    x0 = model.sample(cond, _noise(model, 3, seed=7), sampler="dpm2", num_steps=2)
    again = model.sample(cond, _noise(model, 3, seed=7), sampler="dpm2", num_steps=2)
    other = model.sample(cond, _noise(model, 3, seed=8), sampler="dpm2", num_steps=2)
    assert x0.shape == (3, *model.latent_shape) and x0.dtype == torch.float32
    assert torch.isfinite(x0).all()
    assert torch.equal(x0, again) and not torch.allclose(x0, other)
    pixels = model.decode(x0)
    assert pixels.dtype == np.uint8
    height, width = model.height, model.width
    frames = (model.num_frames,) if model.is_video else ()
    assert pixels.shape == (3, *frames, height, width, 3)


def test_cfg_sampling_runs_batched_with_negative_prompt(model):
    cond = model.encode_prompts(PROMPTS)
    noise = _noise(model, 3, seed=3)
    plain = model.sample(cond, noise, sampler="euler", num_steps=2)
    guided = model.sample(cond, noise, sampler="euler", num_steps=2, guidance_scale=4.0)
    explicit = model.sample(cond, noise, sampler="euler", num_steps=2, guidance_scale=4.0,
                            negative_cond=model.negative_cond(3))
    assert guided.shape == plain.shape and not torch.allclose(guided, plain)
    assert torch.allclose(guided, explicit, atol=1e-6)


def test_euler_rollout_equals_the_diffusers_pipeline_call(model):
    _perturb(model, EMA_ADAPTER)
    cond = model.encode_prompts(PROMPTS)
    noise = _noise(model, 3, seed=5)
    ours = model.sample(cond, noise, sampler="euler", num_steps=2, adapter=EMA_ADAPTER)
    theirs = pipeline_sample(model, cond, noise, num_steps=2, adapter=EMA_ADAPTER)
    torch.testing.assert_close(ours, theirs.float(), atol=1e-5, rtol=1e-5)


#: a second resolution per family, where the schedule rule (a shift by the image's token count) gives another grid
SECOND_RESOLUTION = {"sd3": 32, "wan22_ti2v_5b": 64, "wan21_t2v": 64, "wan22_t2v_a14b": 64, "qwen_image": 64,
                     "zimage": 32, "flux2_klein": 64, "flux1": 64}


def test_euler_rollout_equals_the_pipeline_at_a_second_resolution(model_type, load_tiny):
    model = load_tiny(model_type, resolution=SECOND_RESOLUTION[model_type])
    _perturb(model, EMA_ADAPTER)
    cond = model.encode_prompts(PROMPTS[:2])
    noise = _noise(model, 2, seed=6)
    ours = model.sample(cond, noise, sampler="euler", num_steps=3, adapter=EMA_ADAPTER)
    theirs = pipeline_sample(model, cond, noise, num_steps=3, adapter=EMA_ADAPTER)
    torch.testing.assert_close(ours, theirs.float(), atol=1e-5, rtol=1e-5)


def test_guided_euler_rollout_equals_the_diffusers_pipeline_call(model):
    """Guidance > 1 as each pipeline does it: plain CFG for SD3 and Wan, norm-rescaled CFG for Qwen-Image."""
    _perturb(model, EMA_ADAPTER)
    cond = model.encode_prompts(PROMPTS)
    noise = _noise(model, 3, seed=6)
    ours = model.sample(cond, noise, sampler="euler", num_steps=2, guidance_scale=4.0, adapter=EMA_ADAPTER)
    theirs = pipeline_sample(model, cond, noise, num_steps=2, adapter=EMA_ADAPTER, guidance_scale=4.0)
    torch.testing.assert_close(ours, theirs.float(), atol=1e-5, rtol=1e-5)


def test_prompt_groups_encode_each_prompt_once(model, monkeypatch):
    calls = []
    encode = model.encode_prompts
    monkeypatch.setattr(model, "encode_prompts", lambda prompts: calls.append(list(prompts)) or encode(prompts))
    grouped = encode_prompt_batch(model, [p for p in PROMPTS for _ in range(4)])
    assert calls == [PROMPTS]
    direct = model.repeat_cond(encode(PROMPTS), 4)
    assert grouped.keys() == direct.keys()
    for key in direct:
        assert torch.equal(grouped[key], direct[key])


def test_adapters_start_identical_and_only_default_trains(model):
    x, t, cond = _inputs(model)
    with torch.no_grad():
        v_default, v_ema, v_base = (model.velocity(x, t, cond, a) for a in (TRAINED_ADAPTER, EMA_ADAPTER, None))
    assert torch.equal(v_default, v_ema) and torch.equal(v_default, v_base)
    trainable = {id(p) for p in model.trainable_parameters()}
    assert trainable == {id(p) for p in model.adapter_parameters(TRAINED_ADAPTER)} and trainable
    assert not any(p.requires_grad for p in model.adapter_parameters(EMA_ADAPTER))
    assert all(p.dtype == torch.float32 for p in model.adapter_parameters(EMA_ADAPTER))


def test_switching_the_active_adapter_changes_outputs(model):
    x, t, cond = _inputs(model)
    _perturb(model, TRAINED_ADAPTER)
    with torch.no_grad():
        v_default, v_ema, v_base = (model.velocity(x, t, cond, a) for a in (TRAINED_ADAPTER, EMA_ADAPTER, None))
    assert not torch.allclose(v_default, v_ema)
    assert torch.equal(v_ema, v_base)  # ema still at its zero-B init


def test_lora_training_step_changes_only_default(model):
    x, t, cond = _inputs(model)
    _perturb(model, TRAINED_ADAPTER)  # non-zero B so that lora_A gets gradient too
    base = {n: p.detach().clone() for n, p in model.transformer.named_parameters() if "lora_" not in n}
    ema = model.lora_state_dict(EMA_ADAPTER)
    default = model.lora_state_dict(TRAINED_ADAPTER)
    with torch.no_grad():
        v_ema_before, v_base_before = model.velocity(x, t, cond, EMA_ADAPTER), model.velocity(x, t, cond, None)
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=1e-2)
    loss = model.velocity(x, t, cond, TRAINED_ADAPTER).pow(2).mean()
    loss.backward()
    optimizer.step()
    after = model.lora_state_dict(TRAINED_ADAPTER)
    named = dict(zip(default, model.adapter_parameters(TRAINED_ADAPTER)))
    # every LoRA tensor has a gradient (a family leaves no adapter where the model discards the output) and moved
    assert all(p.grad is not None and p.grad.any() for p in named.values())
    assert all(not torch.equal(after[k], default[k]) for k in named)
    assert all(torch.equal(v, model.lora_state_dict(EMA_ADAPTER)[k]) for k, v in ema.items())
    assert all(torch.equal(p, base[n]) for n, p in model.transformer.named_parameters() if "lora_" not in n)
    with torch.no_grad():
        assert torch.equal(model.velocity(x, t, cond, EMA_ADAPTER), v_ema_before)
        assert torch.equal(model.velocity(x, t, cond, None), v_base_before)


def test_ema_copy_gives_identical_outputs(model):
    x, t, cond = _inputs(model)
    _perturb(model, TRAINED_ADAPTER)
    model.load_lora_state_dict(EMA_ADAPTER, model.lora_state_dict(TRAINED_ADAPTER))
    with torch.no_grad():
        assert torch.equal(model.velocity(x, t, cond, EMA_ADAPTER), model.velocity(x, t, cond, TRAINED_ADAPTER))


def test_saved_adapter_loads_in_diffusers_and_as_lora_path(load_tiny, model, model_type, tmp_path):
    x, t, cond = _inputs(model)
    _perturb(model, TRAINED_ADAPTER)
    with torch.no_grad():
        expected = model.velocity(x, t, cond, TRAINED_ADAPTER)
    model.save_lora(str(tmp_path / "lora"))
    # the real diffusers pipeline's load_lora_weights (once per file: A14B writes one per expert), on a model
    # without our adapters
    plain = load_tiny(model_type, use_lora=False)
    for kwargs in model.lora_load_calls:
        plain.pipe.load_lora_weights(str(tmp_path / "lora"), **kwargs)
    with torch.no_grad():
        torch.testing.assert_close(plain.velocity(x, t, cond, None), expected, atol=1e-5, rtol=1e-5)
    # and back into our two adapters through actor.model.<family>.lora_path
    resumed = load_tiny(model_type, lora_path=str(tmp_path / "lora"))
    with torch.no_grad():
        for adapter in (TRAINED_ADAPTER, EMA_ADAPTER):
            torch.testing.assert_close(resumed.velocity(x, t, cond, adapter), expected, atol=1e-6, rtol=1e-6)


def test_lora_path_with_other_rank_is_rejected(load_tiny, model, model_type, tmp_path):
    model.save_lora(str(tmp_path / "lora"))
    with pytest.raises(ValueError, match="lora_rank|shape"):
        load_tiny(model_type, lora_rank=2, lora_alpha=4, lora_path=str(tmp_path / "lora"))


def test_missing_model_path_names_the_path(load_tiny, model_type, tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_tiny(model_type, path=missing)
    with pytest.raises(ValueError, match="model_path is empty"):
        load_tiny(model_type, path="")
    (tmp_path / "not_a_pipeline").mkdir()
    with pytest.raises(FileNotFoundError, match="not_a_pipeline.*model_index.json"):
        load_tiny(model_type, path=tmp_path / "not_a_pipeline")


def test_folder_of_another_family_is_rejected(load_tiny, model_type, tmp_path):
    other = "StableDiffusion3Pipeline" if model_type == "flux1" else "FluxPipeline"
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": other}))
    with pytest.raises(ValueError, match=f"{other}.*{model_type}"):
        load_tiny(model_type, path=tmp_path)


def test_unreachable_hub_id_names_the_id(load_tiny, model_type, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # fail at once, no network retries
    with pytest.raises(OSError, match="rlrunner-test/no-such-model"):
        load_tiny(model_type, path="rlrunner-test/no-such-model")
