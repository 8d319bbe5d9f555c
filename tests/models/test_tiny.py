"""The ``tiny`` family: a random tiny model written with the pretraining script's save code, loaded on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlrunner.models import EMA_ADAPTER, TRAINED_ADAPTER, model_class
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.tiny import TinyFlowModel
from rlrunner.models.tiny_text import (
    CharTextEncoder,
    build_tiny_unet,
    slot_channels,
    target_text,
    tiny_velocity,
    write_random_tiny,
)

SHIPPED = Path(__file__).resolve().parents[2] / "examples" / "diffusion" / "models" / "tiny-ocr-flow"
PROMPTS = ['a sign that says "4827"', 'a receipt showing the total "93"', "no quotes 55"]


def _cfg(**overrides):
    settings = {"resolution": [16, 32], "num_steps": 2, "eval_num_steps": 2, "train_sampler": "euler", "shift": 1.0,
                "lora_rank": 4, "lora_alpha": 4, "max_sequence_length": 8, **overrides}
    return OmegaConf.structured(FamilyConfig(**settings))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return Path(write_random_tiny(tmp_path_factory.mktemp("tiny")))


def _load(path: Path, **overrides) -> TinyFlowModel:
    return TinyFlowModel.load(str(path), _cfg(**overrides), device=torch.device("cpu"), dtype=torch.float32)


@pytest.fixture
def model(tiny_dir) -> TinyFlowModel:
    return _load(tiny_dir)


def _perturb(model: TinyFlowModel, adapter: str, scale: float = 0.1) -> None:
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.adapter_parameters(adapter):
            p.add_(scale * torch.randn(p.shape, generator=gen))


def test_registry_and_layout(tiny_dir):
    assert model_class("tiny") is TinyFlowModel
    index = json.loads((tiny_dir / "model_index.json").read_text())
    assert index["resolution"] == [16, 32] and index["patch_size"] == 4
    assert (tiny_dir / "unet" / "diffusion_pytorch_model.safetensors").exists()
    assert (tiny_dir / "text_encoder" / "diffusion_pytorch_model.safetensors").exists()


def test_load_errors_name_the_missing_path(tmp_path, tiny_dir):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        _load(missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="model_index.json"):
        _load(tmp_path / "empty")
    with pytest.raises(ValueError, match=r"trained at \[16, 32\]"):
        _load(tiny_dir, resolution=[32, 96])
    with pytest.raises(FileNotFoundError, match="no_lora"):
        _load(tiny_dir, lora_path=str(tmp_path / "no_lora"))


def test_text_encoder_slots():
    enc = CharTextEncoder(max_length=4, dim=8, num_heads=2)
    assert target_text('a sign that says "4 8 2"') == "482"
    assert target_text("no quotes") == "noquotes"
    ids = enc.tokenize(["23", "9x234567"])
    assert ids.tolist() == [[2, 3, 0, 0], [9, 1, 2, 3]]  # '2' -> 2 ... '9' -> 9, 'x' -> <unk> 1, pad 0, cut at 4
    assert enc.encode(PROMPTS).shape == (3, 4, 8)


def test_slot_channels_give_each_column_its_slot_embedding():
    # 2 slots, patch 4: cell centres 1.5, 5.5, 9.5, ..., slot = floor((centre - 6) / 14)
    emb = torch.tensor([[[1.0, 10.0], [2.0, 20.0]]])  # [B=1, L=2, D=2]
    out = slot_channels(emb, height=2, width=10, patch_size=4)
    assert out.shape == (1, 2, 2, 10)
    # slot 0 = pixels [6, 20), slot 1 = [20, 34): centres 1.5, 5.5 lie left of it, 9.5..17.5 in slot 0,
    # 21.5..33.5 in slot 1, 37.5 beyond the last slot
    assert out[0, 0, 0].tolist() == [0, 0, 1, 1, 1, 2, 2, 2, 2, 0]
    assert out[0, 1, 1].tolist() == [0, 0, 10, 10, 10, 20, 20, 20, 20, 0]


def test_velocity_rejects_a_unet_without_slot_channels():
    unet = build_tiny_unet((16, 32), (8, 16), patch_size=4, cross_attention_dim=16, heads=2)
    unet.register_to_config(in_channels=18)  # what a folder from before slot channels declares
    with pytest.raises(ValueError, match="expects 18 input channels, got 34"):
        tiny_velocity(unet, torch.zeros(1, 1, 16, 32), torch.ones(1), torch.zeros(1, 8, 16))


def test_encode_sample_decode_shapes_and_determinism(model):
    assert model.latent_shape == (1, 16, 32) and not model.is_video
    cond = model.encode_prompts(PROMPTS)
    assert cond["text_emb"].shape == (3, 8, 16)
    noise = torch.randn(3, *model.latent_shape, generator=torch.Generator().manual_seed(0))
    x0 = model.sample(cond, noise, sampler="euler", num_steps=2)
    again = model.sample(cond, noise.clone(), sampler="euler", num_steps=2)
    assert x0.shape == (3, 1, 16, 32) and torch.equal(x0, again)
    x0_dpm, states = model.sample(cond, noise, sampler="dpm2", num_steps=3, return_trajectory=True)
    assert len(states) == 4 and torch.equal(states[0], noise) and torch.equal(states[-1], x0_dpm)
    assert torch.equal(x0_dpm, model.sample(cond, noise, sampler="dpm2", num_steps=3))
    assert all(not torch.equal(states[i], states[i + 1]) for i in range(3))  # every step moved the state
    images = model.decode(x0)
    assert images.shape == (3, 16, 32, 3) and images.dtype == np.uint8
    assert np.array_equal(images[..., 0], images[..., 2])


def test_decode_maps_minus_one_one_to_uint8(model):
    lat = torch.tensor([-3.0, -1.0, 0.0, 1.0, 5.0]).view(1, 1, 1, 5).expand(2, 1, 16, 5).contiguous()
    img = model.decode(lat)
    assert img.shape == (2, 16, 5, 3)
    assert img[0, 0, :, 0].tolist() == [0, 0, 128, 255, 255]
    with pytest.raises(ValueError, match=r"\[B, 1, H, W\]"):
        model.decode(torch.zeros(1, 3, 16, 32))


def test_lora_default_and_ema(model):
    assert {p.data_ptr() for p in model.trainable_parameters()} == {
        p.data_ptr() for p in model.adapter_parameters(TRAINED_ADAPTER)}
    cond = model.encode_prompts(PROMPTS[:2])
    x = torch.randn(2, *model.latent_shape, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.3, 0.8])
    with torch.no_grad():
        base = model.velocity(x, t, cond, adapter=None)
        assert torch.allclose(model.velocity(x, t, cond, adapter=TRAINED_ADAPTER), base)  # B = 0 at init
        _perturb(model, TRAINED_ADAPTER)
        v_default = model.velocity(x, t, cond, adapter=TRAINED_ADAPTER)
        v_ema = model.velocity(x, t, cond, adapter=EMA_ADAPTER)
    assert not torch.allclose(v_default, base, atol=1e-4)
    assert torch.allclose(v_ema, base)
    loss = model.velocity(x, t, cond).square().mean()
    loss.backward()
    assert all(p.grad is not None for p in model.adapter_parameters(TRAINED_ADAPTER))
    assert all(p.grad is None for p in model.adapter_parameters(EMA_ADAPTER))
    model.load_lora_state_dict(EMA_ADAPTER, model.lora_state_dict(TRAINED_ADAPTER))
    with torch.no_grad():
        assert torch.allclose(model.velocity(x, t, cond, adapter=EMA_ADAPTER), v_default)


def test_save_lora_round_trip(model, tiny_dir, tmp_path):
    _perturb(model, TRAINED_ADAPTER)
    model.save_lora(str(tmp_path / "lora"))
    reloaded = _load(tiny_dir, lora_path=str(tmp_path / "lora"))
    cond = model.encode_prompts(PROMPTS[:2])
    x, t = torch.randn(2, *model.latent_shape), torch.tensor([0.5, 0.9])
    with torch.no_grad():
        expected = model.velocity(x, t, cond, adapter=TRAINED_ADAPTER)
        for adapter in (TRAINED_ADAPTER, EMA_ADAPTER):
            assert torch.allclose(reloaded.velocity(x, t, cond, adapter=adapter), expected, atol=1e-6)


@pytest.mark.skipif(not (SHIPPED / "model_index.json").exists(), reason="shipped tiny weights not present")
def test_shipped_weights_load_and_sample():
    model = TinyFlowModel.load(str(SHIPPED), _cfg(resolution=[32, 96], lora_rank=16, lora_alpha=16),
                               device=torch.device("cpu"), dtype=torch.float32)
    assert model.latent_shape == (1, 32, 96) and model.alphabet == "23456789"
    noise = torch.randn(2, *model.latent_shape, generator=torch.Generator().manual_seed(0))
    images = model.decode(model.sample(model.encode_prompts(PROMPTS[:2]), noise, sampler="euler", num_steps=2))
    assert images.shape == (2, 32, 96, 3)
    assert sum(f.stat().st_size for f in SHIPPED.rglob("*") if f.is_file()) < 20 * 2**20
