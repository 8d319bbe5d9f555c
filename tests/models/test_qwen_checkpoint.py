"""A Qwen-Image actor trains every LoRA tensor it has, and an actor state lacking some optimizer state loads."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from rlrunner.config.schema import ActorConfig, AlgorithmConfig
from rlrunner.workers.actor import ActorWorker
from rlrunner.workers.rollout import RolloutWorker


def test_every_qwen_image_lora_trains_and_a_state_without_some_optimizer_state_loads_back(tiny_model_cfg):
    """The last block's text stream is discarded by QwenImageTransformer2DModel: its ``to_add_out`` and
    ``add_q_proj`` get no LoRA (one there never received a gradient, which broke DDP), so every LoRA tensor has
    AdamW state after an update.
    A saved state that lacks some tensors' optimizer state (a LoRA that never got a gradient, e.g. an expert no
    sample of a step reached) still loads: those tensors start with zero moments, the others as saved."""
    actor_cfg = OmegaConf.structured(ActorConfig(micro_batch_size=2, global_batch_size=2))
    actor_cfg.model = tiny_model_cfg("qwen_image")
    rollout = RolloutWorker(actor_cfg.model, seed=0)
    out = rollout.generate(['a sign that says "a"'], 2, step=0, round_index=0)
    actor = ActorWorker(actor_cfg, OmegaConf.structured(AlgorithmConfig()), num_train_steps=2)
    actor.update([out.train], torch.arange(2), torch.arange(2), torch.tensor([1.0, -1.0]), step=0)
    trainable = {n: p for n, p in actor.model.transformer.named_parameters() if p.requires_grad}
    assert trainable and all(p in actor.optimizer.state for p in trainable.values())
    last = len(actor.model.transformer.transformer_blocks) - 1
    dead = tuple(f"transformer_blocks.{last}.attn.{name}." for name in ("to_add_out", "add_q_proj"))
    assert not any(n.startswith(dead) for n in trainable)
    state = actor.state_dict()
    untrained = sorted(state["optimizer"]["state"])[:2]
    for name in untrained:
        del state["optimizer"]["state"][name]

    restored = ActorWorker(actor_cfg, OmegaConf.structured(AlgorithmConfig()), num_train_steps=2)
    restored.load_state_dict(state)
    loaded = {n: restored.optimizer.state[p] for n, p in restored.model.transformer.named_parameters()
              if p.requires_grad}
    for name, param in trainable.items():
        if name in untrained:  # torch gives them an empty (zero) state on load
            assert not loaded[name]["exp_avg"].any() and not loaded[name]["exp_avg_sq"].any(), name
            continue
        assert torch.equal(actor.optimizer.state[param]["exp_avg"], loaded[name]["exp_avg"]), name
        assert torch.equal(actor.optimizer.state[param]["exp_avg_sq"], loaded[name]["exp_avg_sq"]), name
