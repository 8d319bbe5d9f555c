"""``python -m rlrunner.commands.plan`` counts the CLIP-family scorers on the env device from config files alone: the counts
equal the loaded models' bytes, and the default hub ids have their published parameter counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_clip_rewards import fake_open_clip_state

from rlrunner.commands.plan import main
from rlrunner.config.schema import EnvConfig
from rlrunner.rewards import REWARDS, build_reward, reward_config
from rlrunner.rewards.clip.tiny import write_tokenizer
from rlrunner.sizing.memory import env_plan

TINY_CLIP = Path(__file__).resolve().parents[2] / "examples/diffusion/models/tiny-clip"


def held_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def test_counts_equal_the_loaded_scorers(tmp_path):
    spec = reward_config({"model": "pickscore", "model_path": str(TINY_CLIP)})
    [(name, nbytes, detail)] = REWARDS["pickscore"].device_memory(spec)
    assert name == "pickscore scorer" and nbytes == held_bytes(build_reward(spec).model) and "fp32" in detail
    torch.save({"state_dict": fake_open_clip_state()}, tmp_path / "hps.pt")
    write_tokenizer(tmp_path / "tok")
    spec = reward_config({"model": "hpsv2", "model_path": str(tmp_path / "hps.pt"),
                          "processor_path": str(tmp_path / "tok")})
    [(_, nbytes, _)] = REWARDS["hpsv2"].device_memory(spec)
    assert nbytes == held_bytes(build_reward(spec).model)


@pytest.mark.parametrize("model, params", [("pickscore", 986_109_441), ("hpsv2", 986_109_441),
                                           ("clipscore", 427_616_513)])
def test_default_hub_scorers_have_their_published_sizes(model, params):
    """ViT-H-14: 986.1 M parameters (open_clip's model card), ViT-L/14: 427.6 M; bf16 = 2 bytes each, plus the
    int64 position ids (257 + 77 of them for ViT-H-14 at 224 px, 257 + 77 for ViT-L/14)."""
    [(_, nbytes, detail)] = REWARDS[model].device_memory(reward_config({"model": model, "precision": "bf16"}))
    assert nbytes == 2 * params + 8 * (257 + 77) and f"{params / 1e6:.1f} M parameters in bf16" in detail


def test_env_plan_counts_a_scorer_shared_by_train_and_eval_once():
    reward = {"type": "multi", "precision": "bf16",
              "rewards": [{"model": "pickscore"}, {"model": "aesthetic", "head_path": "x.pth"}]}
    env = OmegaConf.merge(OmegaConf.structured(EnvConfig), {"train": {"reward": reward}, "eval": {"reward": reward}})
    plan = env_plan(env)
    assert [p.name for p in plan.parts] == ["pickscore scorer", "aesthetic scorer", "aesthetic MLP head"]
    head = 768 * 1024 + 1024 + 1024 * 128 + 128 + 128 * 64 + 64 + 64 * 16 + 16 + 16 + 1
    assert plan.parts[2].nbytes == 4 * head
    assert plan.resident_bytes == 2 * 986_109_441 + 2 * 427_616_513 + 16 * (257 + 77) + 4 * head


def test_plan_prints_the_scorers_of_the_tiny_recipe(capsys, monkeypatch):
    monkeypatch.chdir(TINY_CLIP.parents[3])
    assert main(["tiny_nft_pickscore_clipscore"]) == 0
    out = capsys.readouterr().out
    assert "env       pickscore scorer" in out and "env       clipscore scorer" in out
