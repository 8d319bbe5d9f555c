"""bf16 on CPU, end to end: the SD3 and Wan family recipes train 2 steps through the launcher on the tiny folders with
``precision: bf16`` kept on the CPU (``actor.model.half_precision_on_cpu``), so dtype mistakes that would only show
on a GPU show here."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from shell_helpers import clean_env

from rlrunner.models import TRAINED_ADAPTER, build_model
from rlrunner.recipe import ModelConfig
from rlrunner.utils.device import resolve_dtype

ROOT = Path(__file__).resolve().parents[2]
TINY_OCR = ROOT / "examples/diffusion/data/tiny_ocr"
# the family's tiny settings, a 2 x 2 sample step in one optimizer step, a cheap reward, eval and save at step 2
RECIPES = {"sd3": ("sd3_nft_ocr", {"resolution": 16, "max_sequence_length": 8}),
           "wan22_ti2v_5b": ("wan22_ti2v_5b_nft_video_ocr", {"resolution": 32, "max_sequence_length": 8})}
STEP = ["algorithm.group_size=2", "env.train.total_num_envs=4", "env.train.rollout_epoch=1",
        "env.eval.total_num_envs=2", "actor.micro_batch_size=2", "actor.global_batch_size=4",
        *(f"env.{split}.{key}" for split in ("train", "eval")
          for key in ("reward.model=jpeg_compressibility", f"dataset.path={TINY_OCR}")),
        "cluster.backend=local", "cluster.num_devices_per_node=1", "runner.max_steps=2", "runner.val_check_interval=2",
        "runner.save_interval=2", "runner.val_before_train=false", "runner.sample_log_interval=0"]


def test_half_precision_on_cpu_keeps_bf16_for_the_base_and_float32_for_lora(tiny_dirs):
    cfg = OmegaConf.structured(ModelConfig(model_type="sd3", model_path=str(tiny_dirs("sd3")), precision="bf16",
                                           device="cpu", half_precision_on_cpu=True))
    cfg.sd3.merge_with({"resolution": 16, "max_sequence_length": 8, "lora_rank": 4, "lora_alpha": 8})
    model = build_model(cfg)
    assert model.dtype == torch.bfloat16
    assert {p.dtype for n, p in model.transformer.named_parameters() if "lora_" not in n} == {torch.bfloat16}
    assert {p.dtype for p in model.adapter_parameters(TRAINED_ADAPTER)} == {torch.float32}
    assert model.vae.dtype == torch.float32  # decoding precision
    cpu = torch.device("cpu")
    assert [resolve_dtype(p, cpu, half_on_cpu=True) for p in ("bf16", "fp16", "fp32")] == [
        torch.bfloat16, torch.float16, torch.float32]
    assert resolve_dtype("bf16", cpu) == torch.float32  # the default: half precision falls back to fp32 on CPU


def _launch(model_type: str, model_path: Path, log_root: Path, half_on_cpu: bool) -> tuple[Path, list[dict], str]:
    """The family recipe through run_diffusion.sh at ``precision: bf16``; the run folder, its metrics and stderr."""
    recipe, family = RECIPES[model_type]
    prefix = f"actor.model.{model_type}"
    overrides = [f"actor.model.model_path={model_path}", "actor.model.device=cpu", "actor.model.precision=bf16",
                 f"actor.model.half_precision_on_cpu={str(half_on_cpu).lower()}",
                 *(f"{prefix}.{key}={value}" for key, value in family.items()),
                 f"{prefix}.lora_rank=4", f"{prefix}.lora_alpha=8", f"{prefix}.num_steps=2", f"{prefix}.eval_num_steps=2",
                 *STEP]
    env = {**clean_env(), "PYTHON": sys.executable, "RLRUNNER_LOG_ROOT": str(log_root)}
    result = subprocess.run(["bash", str(ROOT / "examples/diffusion/run_diffusion.sh"), recipe, *overrides], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = log_root.iterdir()
    return (run_dir, [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()],
            result.stderr)


@pytest.mark.slow  # 2 launches a family, each a Python that loads the stack: a minute or two of CPU
@pytest.mark.parametrize("model_type", list(RECIPES))
def test_family_recipe_trains_two_bf16_steps_on_cpu_through_the_launcher(model_type, tiny_dirs, tmp_path):
    run_dir, records, stderr = _launch(model_type, tiny_dirs(model_type), tmp_path / "bf16", half_on_cpu=True)
    assert "found no accelerator" not in stderr  # bf16 as asked: nothing to say
    steps = [r for r in records if "train/actor/nft_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["train/actor/nft_loss"]) and r["train/actor/grad_norm"] > 0
        assert r["train/actor/nonfinite"] == 0
    assert any("eval/avg" in r for r in records)
    assert (run_dir / "checkpoints/global_step_2/adapter").is_dir()
    # the same command without the flag computes in fp32 (the CPU default): other numbers, so bf16 really ran
    _, fp32, stderr = _launch(model_type, tiny_dirs(model_type), tmp_path / "fp32", half_on_cpu=False)
    # ... and says so at start, in one line: what it does instead and how to choose
    (note,) = [line for line in stderr.splitlines() if "found no accelerator" in line]
    assert note.startswith("rlrunner: actor.model.precision is bf16 but the actor and rollout worker(s) found no")
    assert "compute in fp32 on the CPU instead" in note and "actor.model.device: cuda" in note
    fp32_losses = [r["train/actor/nft_loss"] for r in fp32 if "train/actor/nft_loss" in r]
    assert len(fp32_losses) == 2 and fp32_losses[0] != steps[0]["train/actor/nft_loss"]


def test_the_fallback_note_names_the_workers_on_the_cpu_and_nothing_when_all_is_as_asked():
    from rlrunner.utils.device import precision_fallback_note

    note = precision_fallback_note("fp16", False, {"actor": "cuda:0", "rollout": "cpu"})
    assert note.startswith("rlrunner: actor.model.precision is fp16 but the rollout worker(s) found no accelerator")
    assert precision_fallback_note("fp32", False, {"actor": "cpu", "rollout": "cpu"}) is None
    assert precision_fallback_note("bf16", True, {"actor": "cpu", "rollout": "cpu"}) is None  # bf16 kept on the CPU
    assert precision_fallback_note("bf16", False, {"actor": "cuda:0", "rollout": "cuda:1"}) is None
