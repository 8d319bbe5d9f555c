"""A Qwen-Image actor's checkpoint loads back although some LoRA tensors never train."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from rlrunner.config.schema import ActorConfig, AlgorithmConfig
from rlrunner.workers.actor import ActorWorker
from rlrunner.workers.rollout import RolloutWorker


def test_actor_state_without_optimizer_state_for_never_trained_lora_loads_back(tiny_model_cfg):
    """The last block's text stream is discarded by QwenImageTransformer2DModel, so the LoRA of its ``to_add_out``
    gets no gradient and AdamW keeps no state for it: loading the saved state must accept that (it did not)."""
    actor_cfg = OmegaConf.structured(ActorConfig(micro_batch_size=2, global_batch_size=2))
    actor_cfg.model = tiny_model_cfg("qwen_image")
    rollout = RolloutWorker(actor_cfg.model, seed=0)
    out = rollout.generate(['a sign that says "a"'], 2, step=0, round_index=0)
    actor = ActorWorker(actor_cfg, OmegaConf.structured(AlgorithmConfig()), num_train_steps=2)
    actor.update([out.train], torch.arange(2), torch.arange(2), torch.tensor([1.0, -1.0]), step=0)
    untrained = [n for n, p in actor.model.transformer.named_parameters() if p.requires_grad and p not in
                 actor.optimizer.state]
    assert untrained and all(".to_add_out.lora_" in n for n in untrained)
    state = actor.state_dict()

    restored = ActorWorker(actor_cfg, OmegaConf.structured(AlgorithmConfig()), num_train_steps=2)
    restored.load_state_dict(state)
    saved = {n: actor.optimizer.state[p] for n, p in actor.model.transformer.named_parameters() if p.requires_grad
             and n not in untrained}
    loaded = {n: restored.optimizer.state[p] for n, p in restored.model.transformer.named_parameters()
              if p.requires_grad}
    for name, moments in saved.items():
        assert torch.equal(moments["exp_avg"], loaded[name]["exp_avg"]), name
        assert torch.equal(moments["exp_avg_sq"], loaded[name]["exp_avg_sq"]), name
    for name in untrained:  # torch gives them an empty (zero) state on load; AdamW never reads it without gradients
        assert not loaded[name]["exp_avg"].any() and not loaded[name]["exp_avg_sq"].any(), name
