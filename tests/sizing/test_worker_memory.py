"""What each worker loads (the folders ``from_pretrained`` opens) and holds, counted by walking the worker object: the
actor only what it trains (denoiser with its LoRA adapters, optimizer state), the rollout worker the denoiser, text
encoders and VAE."""

from __future__ import annotations

import gc
import json
import types
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from rlrunner.config.schema import ActorConfig, AlgorithmConfig
from rlrunner.workers.actor import ActorWorker
from rlrunner.workers.rollout import RolloutWorker

# objects whose references lead to shared state (module globals, classes), not to what a worker holds
_SHARED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.CodeType, types.FrameType)


def resident(root: Any) -> dict[int, int]:
    """Every tensor storage reachable from ``root``: data pointer -> bytes."""
    seen, held, stack = set(), {}, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SHARED):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            held[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
        else:
            stack.extend(gc.get_referents(obj))
    return held


def storages(tensors: Iterable[torch.Tensor]) -> dict[int, int]:
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def module_storages(*modules: torch.nn.Module) -> dict[int, int]:
    return storages(t for m in modules for t in (*m.parameters(), *m.buffers()))


@pytest.fixture
def opened(monkeypatch) -> set[str]:
    """The parts of a model folder that ``from_pretrained`` opens from now on (sub-folder names: ``transformer``,
    ``vae``, ``tokenizer_2``, ...), for diffusers models, transformers models and tokenizers."""
    from diffusers import ModelMixin
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    names: set[str] = set()
    for base in (ModelMixin, PreTrainedModel, PreTrainedTokenizerBase):
        def spy(cls, path, *args, _original=base.from_pretrained.__func__, **kwargs):
            names.add(kwargs.get("subfolder") or Path(path).name)
            return _original(cls, path, *args, **kwargs)

        monkeypatch.setattr(base, "from_pretrained", classmethod(spy))
    return names


@pytest.mark.parametrize("model_type", ["sd3", "wan22_ti2v_5b", "qwen_image", "flux1", "tiny"])
def test_the_actor_loads_only_the_denoiser_and_the_rollout_everything(model_type, tiny_model_cfg, tiny_dirs, opened,
                                                                      tmp_path):
    if model_type == "tiny":  # not a diffusers pipeline: a UNet and a character text encoder
        from rlrunner.models.tiny_text import write_random_tiny

        model_cfg = tiny_model_cfg("sd3")
        model_cfg.model_type, model_cfg.model_path = "tiny", write_random_tiny(str(tmp_path / "tiny"))
        model_cfg.tiny = OmegaConf.merge(model_cfg.tiny, {"resolution": [16, 32]})
        denoiser = "unet"
    else:
        model_cfg, denoiser = tiny_model_cfg(model_type), "transformer"
    index = json.loads((Path(model_cfg.model_path) / "model_index.json").read_text())
    parts = {name for name, entry in index.items()
             if isinstance(entry, list) and len(entry) == 2 and all(isinstance(part, str) for part in entry)
             and not name.startswith("_") and name != "scheduler"}
    RolloutWorker(model_cfg, seed=0)
    assert opened == parts and {denoiser, "text_encoder"} <= parts  # it encodes, samples and decodes
    opened.clear()
    actor_cfg = OmegaConf.structured(ActorConfig(micro_batch_size=2, global_batch_size=4))
    actor_cfg.model = model_cfg
    actor = ActorWorker(actor_cfg, OmegaConf.structured(AlgorithmConfig()), num_train_steps=1)
    assert opened == {denoiser}  # text encoders and VAE never read: neither host nor device memory
    assert not actor.model.text_encoders and actor.model.vae is None


@pytest.mark.parametrize("model_type", ["sd3", "wan22_ti2v_5b"])
def test_the_actor_holds_only_the_denoiser_its_lora_and_optimizer_state(model_type, tiny_model_cfg):
    actor_cfg = OmegaConf.structured(ActorConfig(micro_batch_size=2, global_batch_size=4))
    actor_cfg.model = tiny_model_cfg(model_type)
    rollout = RolloutWorker(actor_cfg.model, seed=0)
    out = rollout.generate(["a sign", "b sign"], 2, step=0, round_index=0)
    actor = ActorWorker(actor_cfg, OmegaConf.structured(AlgorithmConfig()), num_train_steps=1)
    actor.update([out.train], torch.arange(4), torch.arange(4), torch.tensor([1.0, -1.0, 0.5, -0.5]), step=0)

    model = actor.model
    assert not model.text_encoders and model.vae is None
    denoiser = module_storages(model.transformer)  # base weights and buffers, both LoRA adapters
    optimizer = storages(v for state in actor.optimizer.state.values() for v in state.values())
    scheduler = resident(model.pipe.scheduler)  # its sigma / timestep tables ([1000] float32 each)
    trainable = storages(actor.params)
    assert sum(optimizer.values()) >= 2 * sum(trainable.values())  # AdamW: exp_avg and exp_avg_sq
    held = resident(actor)
    assert held == {**denoiser, **optimizer, **scheduler}
    assert sum(held.values()) == sum(denoiser.values()) + sum(optimizer.values()) + sum(scheduler.values())

    served = rollout.model
    text, vae = module_storages(*served.text_encoders.values()), module_storages(served.vae)
    assert text and vae
    assert resident(rollout) == {**module_storages(served.transformer), **text, **vae, **resident(served.pipe.scheduler)}


def test_released_text_encoders_and_vae_are_freed(load_tiny):
    model = load_tiny("sd3")
    refs = [weakref.ref(m) for m in (*model.text_encoders.values(), model.vae)]
    model.release_text_encoders()
    model.release_vae()
    assert all(ref() is None for ref in refs)  # no reference left anywhere: collected, not just moved
    with pytest.raises(RuntimeError, match="text encoders were released"):
        model.encode_prompts(["a"])


def test_a_denoiser_only_load_of_an_unreachable_hub_id_names_the_id(tiny_model_cfg, monkeypatch):
    import huggingface_hub.constants

    from rlrunner.models import build_model

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # fail at once, no network retries
    cfg = tiny_model_cfg("sd3")
    cfg.model_path = "rlrunner-test/no-such-model"
    with pytest.raises(OSError, match="could not load StableDiffusion3Pipeline from hub id .*rlrunner-test/no-such"):
        build_model(cfg, denoiser_only=True)
