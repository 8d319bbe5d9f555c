"""The exported adapter and its card: the algorithm that trained it, an absolute base model path, files readable by
all, and loading instructions that work as written (the tiny model's through rlrunner, in a fresh shell)."""

from __future__ import annotations

import json
import re
import stat
import subprocess

import pytest
import torch
from runner_helpers import small_recipe
from safetensors.torch import load_file
from shell_helpers import ROOT, clean_env

from rlrunner.commands.export import export_adapter, main, model_card
from rlrunner.run.runner import run


@pytest.fixture(scope="module")
def awm_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    log_dir = root / "run"
    log_dir.mkdir()
    run(small_recipe(root, "algorithm.name=awm", "runner.max_steps=1", "runner.val_check_interval=0",
                     "runner.val_before_train=false", "runner.sample_log_interval=0"), log_dir)
    return log_dir


def test_the_card_names_the_algorithm_and_the_absolute_base_model_and_files_are_0644(awm_run, tmp_path):
    out = export_adapter(str(awm_run), str(tmp_path / "lora"))
    card = (out / "README.md").read_text()
    assert card.startswith("# LoRA adapter (default) trained with rlrunner (AWM, Advantage Weighted Matching)")
    base = json.loads((awm_run / "checkpoints/global_step_1/manifest.json").read_text())["model_path"]
    assert f"- base model: `{base}` (model_type `tiny`)" in card and base.startswith("/")
    assert "DiffusionNFT" not in card and "load_lora_weights" not in card and "no diffusers pipeline" in card
    for file in out.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o644, file


def test_an_existing_folder_keeps_its_files_modes_and_its_own_readme(awm_run, tmp_path, capsys):
    out = tmp_path / "home"
    out.mkdir()
    (out / ".netrc").write_text("machine example.com password secret\n")
    (out / ".netrc").chmod(0o600)
    (out / "README.md").write_text("# my notes\n")
    assert main([str(awm_run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.endswith(f"(how to load it: {out / 'RLRUNNER_CARD.md'})\n")
    assert stat.S_IMODE((out / ".netrc").stat().st_mode) == 0o600
    assert (out / "README.md").read_text() == "# my notes\n"
    assert (out / "RLRUNNER_CARD.md").read_text().startswith("# LoRA adapter (default) trained with rlrunner")
    for name in ("RLRUNNER_CARD.md", "model.yaml", "pytorch_lora_weights.safetensors"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644, name
    (out / "README.md").unlink()  # a card of an earlier export is README.md, and a new export replaces it
    export_adapter(str(awm_run), str(out))
    export_adapter(str(awm_run), str(out), adapter="ema")
    assert (out / "README.md").read_text().startswith("# LoRA adapter (ema) trained with rlrunner")


def test_the_cards_rlrunner_snippet_loads_the_adapter_in_a_fresh_shell(awm_run, tmp_path):
    out = export_adapter(str(awm_run), str(tmp_path / "lora"))
    snippet = re.search(r"```python\n(.*?)```", (out / "README.md").read_text(), re.DOTALL).group(1)
    check = (f"{snippet}\nassert images.shape[0] == 1 and images.dtype.name == 'uint8'\n"
             "torch.save(model.lora_state_dict('default'), 'loaded.pt')\n")
    done = subprocess.run([str(ROOT / "bin/rlrunner"), "python", "-c", check], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = torch.load(tmp_path / "loaded.pt")
    exported = load_file(awm_run / "checkpoints/global_step_1/adapter/pytorch_lora_weights.safetensors")
    assert len(loaded) == len(exported) > 0
    assert sorted(t.sum().item() for t in loaded.values()) == pytest.approx(sorted(t.sum().item() for t in
                                                                                   exported.values()))


def test_a_diffusers_familys_card_loads_through_its_pipeline(tmp_path):
    manifest = {"model_type": "sd3", "lora_rank": 32, "lora_alpha": 64, "global_step": 7}
    card = model_card("nft", "ema", manifest, "stabilityai/stable-diffusion-3.5-medium", tmp_path / "ckpt",
                      tmp_path / "out")
    assert card.startswith("# LoRA adapter (ema) trained with rlrunner (DiffusionNFT)")
    assert "pipe = StableDiffusion3Pipeline.from_pretrained('stabilityai/stable-diffusion-3.5-medium')" in card
    assert f"pipe.load_lora_weights('{tmp_path / 'out'}')" in card
