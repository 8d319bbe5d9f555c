"""The guard on :func:`rlrunner.models.lora.fast_switch`: same outputs as peft's own ``set_adapter``, every family.

``fast_switch`` writes the two attributes a peft LoRA layer's forward reads. If a peft release renames them or
reads something else, these tests fail (instead of rollouts silently using the wrong adapter).
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from rlrunner.models.lora import ADAPTERS, EMA_ADAPTER, TRAINED_ADAPTER, fast_switch
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.tiny import TinyFlowModel
from rlrunner.models.tiny_text import write_random_tiny

PROMPTS = ['a sign that says "42"', 'the word "rl" on a wall']


@pytest.fixture(params=["tiny", "sd3", "wan22_ti2v_5b", "wan22_t2v_a14b", "qwen_image", "zimage", "flux2_klein",
                        "flux1"])
def model(request, load_tiny, tmp_path_factory):
    if request.param == "tiny":
        cfg = OmegaConf.structured(FamilyConfig(resolution=[16, 32], shift=1.0, lora_rank=4, lora_alpha=8,
                                                max_sequence_length=8))
        path = write_random_tiny(tmp_path_factory.mktemp("tiny"))
        return TinyFlowModel.load(str(path), cfg, device=torch.device("cpu"), dtype=torch.float32)
    return load_tiny(request.param)


def _peft_switch(layers: list, adapter: str | None) -> None:
    """peft's public switch on each LoRA layer (toggles ``requires_grad`` too; the test restores it)."""
    for layer in layers:
        layer.enable_adapters(adapter is not None)
        if adapter is not None:
            layer.set_adapter(adapter)


def test_fast_switch_matches_peft_set_adapter(model):
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # give each adapter its own non-zero weights, so every switch changes the output
        for scale, adapter in ((0.3, TRAINED_ADAPTER), (-0.2, EMA_ADAPTER)):
            for p in model.adapter_parameters(adapter):
                p.add_(scale * torch.randn(p.shape, generator=gen))
    cond = model.encode_prompts(PROMPTS)
    x = torch.randn((len(PROMPTS), *model.latent_shape), generator=gen)
    t = torch.tensor([0.7, 0.3])
    layers = model.lora.layers
    trainable = [p.requires_grad for p in model.transformer.parameters()]
    velocity_fn = model.guided_velocity_fn(cond)  # one denoiser pass, with FLUX.1-dev's guidance input where it has one
    outputs = {}
    with torch.no_grad():
        for adapter in (*ADAPTERS, None):
            fast_switch(layers, adapter)
            # peft's public read side agrees with what fast_switch wrote
            assert all(layer.disable_adapters == (adapter is None) for layer in layers)
            if adapter is not None:
                assert all(layer.active_adapters == [adapter] for layer in layers)
            fast = velocity_fn(x, t)
            _peft_switch(layers, adapter)
            assert torch.equal(fast, velocity_fn(x, t)), f"adapter {adapter!r}"
            outputs[adapter] = fast
    assert not torch.equal(outputs[TRAINED_ADAPTER], outputs[EMA_ADAPTER])
    assert not torch.equal(outputs[EMA_ADAPTER], outputs[None])
    # fast_switch never touches requires_grad: after peft's switch put it back, only `default` trains again
    for p, flag in zip(model.transformer.parameters(), trainable):
        p.requires_grad_(flag)
    fast_switch(layers, TRAINED_ADAPTER)
    with torch.no_grad():
        assert torch.equal(model.velocity(x, t, cond, TRAINED_ADAPTER), outputs[TRAINED_ADAPTER])
