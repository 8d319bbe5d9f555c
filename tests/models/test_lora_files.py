"""The driver writes checkpoint adapters without a model (``FlowModel.write_lora_files``, from the tensors the actor
returns): the files hold what the model's own ``save_lora`` writes, for every family -- the same safetensors header
(names, dtypes, shapes, offsets, LoRA metadata) and byte-identical tensor data."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlrunner.models import TRAINED_ADAPTER, model_class
from rlrunner.models.tiny_text import write_random_tiny
from rlrunner.recipe import ModelConfig


def _header_and_data(path: Path) -> tuple[dict, bytes]:
    """A safetensors file's parsed header and its raw tensor bytes (the header's key order is not fixed: safetensors
    writes its metadata map in hash order)."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + size]), raw[8 + size:]


def _perturbed(model):
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.adapter_parameters(TRAINED_ADAPTER):
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(params=["tiny", "sd3", "wan22_ti2v_5b", "wan22_t2v_a14b", "qwen_image", "flux1"])
def model_and_cfg(request, load_tiny, tmp_path_factory):
    if request.param == "tiny":  # rlrunner's own family: a UNet, whose files use diffusers' older key names
        family_cfg = OmegaConf.structured(ModelConfig).tiny
        family_cfg.resolution = [16, 32]  # write_random_tiny's
        path = write_random_tiny(str(tmp_path_factory.mktemp("tiny")))
        model = model_class("tiny").load(path, family_cfg, device=torch.device("cpu"), dtype=torch.float32)
        return _perturbed(model), family_cfg
    model = load_tiny(request.param)
    return _perturbed(model), model.cfg


def test_files_written_from_tensors_alone_equal_the_models_own(model_and_cfg, tmp_path):
    model, family_cfg = model_and_cfg
    state = model.lora_state_dict(TRAINED_ADAPTER)
    model.save_lora(str(tmp_path / "by_model"), TRAINED_ADAPTER, state)
    type(model).write_lora_files(str(tmp_path / "by_driver"), state, family_cfg)
    written = sorted(p.name for p in (tmp_path / "by_driver").iterdir())
    # one file, or one per expert (A14B: the second expert's is pytorch_lora_weights_transformer_2.safetensors)
    expected = sorted(kw.get("weight_name", "pytorch_lora_weights.safetensors") for kw in model.lora_load_calls)
    assert written == sorted(p.name for p in (tmp_path / "by_model").iterdir()) == expected
    for name in written:
        header, data = _header_and_data(tmp_path / "by_driver" / name)
        assert (header, data) == _header_and_data(tmp_path / "by_model" / name)
        metadata = json.loads(header["__metadata__"]["lora_adapter_metadata"])
        assert metadata[f"{model.lora_component}.r"] == family_cfg.lora_rank
