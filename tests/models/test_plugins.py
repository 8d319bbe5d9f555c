"""Model families and rewards from a package of one's own: installed as pip would (a ``.dist-info`` with
entry_points.txt on PYTHONPATH), never by editing rlrunner/, and run through the launcher as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from runner_helpers import make_assets
from shell_helpers import ROOT, clean_env

from rlrunner.models.tiny_text import write_random_tiny

LAUNCHER = ROOT / "examples/diffusion/run_diffusion.sh"

FAMILY = '''
import json
import os
from dataclasses import dataclass

from omegaconf import OmegaConf

from rlrunner.models.tiny import TinyFlowModel, TinySettings


@dataclass
class PlugTinySettings(TinySettings):
    brightness: float = 0.5  # a key of this family only


class PlugTinyFlowModel(TinyFlowModel):
    model_type = "plug_tiny"
    settings_type = PlugTinySettings

    @classmethod
    def load(cls, model_path, family_cfg, **kwargs):
        with open(os.environ["PLUG_RECORD"], "a") as f:  # what the family was handed, for the test to read
            f.write(json.dumps({"settings": OmegaConf.get_type(family_cfg).__name__,
                                "brightness": family_cfg.brightness}) + "\\n")
        return super().load(model_path, family_cfg, **kwargs)
'''

REWARDS = '''
import numpy as np

from rlrunner.rewards.output import RewardOutput
from rlrunner.rewards.registry import Reward, register_reward


@register_reward("plug_brightness")
class BrightnessReward(Reward):
    name = "plug_brightness"

    def __call__(self, images, prompts):
        pixels = np.asarray(images, dtype=np.float32)
        pixels = pixels / 255.0 if pixels.max() > 1 else pixels
        avg = pixels.reshape(len(pixels), -1).mean(axis=1).astype(np.float32)
        return RewardOutput(avg=avg, parts={self.name: avg})
'''


def install(site: Path, name: str, modules: dict[str, str], entry_points: str) -> Path:
    """What ``pip install --target site`` writes for package ``name``: its modules and a dist-info whose
    entry_points.txt Python's importlib.metadata reads."""
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text("")
    for module, source in modules.items():
        (site / name / f"{module}.py").write_text(source)
    info = site / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    return site


def launch(*args: str, site: Path, log_root: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {**clean_env(), "PYTHON": sys.executable, "RLRUNNER_LOG_ROOT": str(log_root), "PYTHONPATH": str(site),
               **env}
    return subprocess.run(["bash", str(LAUNCHER), *args], check=False, cwd=ROOT, env=environ, capture_output=True,
                          text=True, timeout=600)


def plug_site(tmp_path: Path) -> Path:
    return install(tmp_path / "site", "plugtiny", {"family": FAMILY, "rewards": REWARDS},
                   "[rlrunner.model_families]\nplug_tiny = plugtiny.family:PlugTinyFlowModel\n\n"
                   "[rlrunner.rewards]\nplugtiny = plugtiny.rewards\n")


def plug_model(tmp_path: Path) -> Path:
    """A random tiny model folder whose index names the plugin's family (so that model_type auto picks it)."""
    model = Path(write_random_tiny(str(tmp_path / "plug_model")))
    index = json.loads((model / "model_index.json").read_text())
    (model / "model_index.json").write_text(json.dumps({**index, "_rlrunner_family": "plug_tiny"}))
    return model


PLUG_OVERRIDES = [
    "actor.model.model_type=auto",
    "actor.model.plug_tiny.resolution=[16,32]", "actor.model.plug_tiny.num_steps=2",
    "actor.model.plug_tiny.eval_num_steps=2", "actor.model.plug_tiny.lora_rank=4", "actor.model.plug_tiny.lora_alpha=4",
    "algorithm.group_size=4", "env.train.total_num_envs=4", "env.eval.total_num_envs=4", "actor.micro_batch_size=4",
    "actor.global_batch_size=4", "env.train.reward.model=plug_brightness", "env.eval.reward.model=plug_brightness",
    "runner.max_steps=1", "runner.val_check_interval=1", "runner.save_interval=1", "cluster.backend=local",
]


@pytest.mark.slow
def test_a_plugin_family_and_reward_train_one_step_through_the_launcher(tmp_path):
    site, model, record = plug_site(tmp_path), plug_model(tmp_path), tmp_path / "record.jsonl"
    _, data = make_assets(tmp_path)
    result = launch("tiny_nft_ocr", *PLUG_OVERRIDES, f"actor.model.model_path={model}",
                    f"env.train.dataset.path={data}", f"env.eval.dataset.path={data}",
                    "actor.model.plug_tiny.brightness=0.25", site=site, log_root=tmp_path / "logs",
                    PLUG_RECORD=str(record))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "rlrunner: plugin" not in result.stderr  # it loaded: nothing to report
    (run_dir,) = (tmp_path / "logs").iterdir()
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["actor"]["model"]["model_type"] == "plug_tiny"  # auto found the plugin's folder
    assert config["actor"]["model"]["plug_tiny"]["brightness"] == 0.25
    loads = [json.loads(line) for line in record.read_text().splitlines()]
    assert loads and all(r == {"settings": "PlugTinySettings", "brightness": 0.25} for r in loads)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval/plug_brightness" in r] == [0, 1]
    (train,) = [r for r in records if "env/plug_brightness" in r]  # the training step scored by the plugin reward
    assert train["step"] == 1 and 0.0 <= train["env/plug_brightness"] <= 1.0
    assert (run_dir / "checkpoints" / "global_step_1").is_dir()


@pytest.mark.slow
def test_a_plugin_familys_section_is_typed_and_rejects_unknown_keys(tmp_path):
    site, model = plug_site(tmp_path), f"actor.model.model_path={plug_model(tmp_path)}"
    ok = launch("tiny_nft_ocr", "actor.model.model_type=plug_tiny", model, "--dry-run", site=site, log_root=tmp_path)
    assert ok.returncode == 0, ok.stderr
    section = yaml.safe_load(ok.stdout)["actor"]["model"]["plug_tiny"]
    assert section["brightness"] == 0.5 and section["resolution"] == [32, 96]  # its own key, tiny's defaults
    unknown = "unknown key 'actor.model.plug_tiny.brightnes' (did you mean 'actor.model.plug_tiny.brightness'?)"
    wrong_type = "key 'actor.model.plug_tiny.brightness' has value 'bright' of the wrong type; expected float"
    for override, message in [("actor.model.plug_tiny.brightnes=1", unknown),
                              ("actor.model.plug_tiny.brightness=bright", wrong_type)]:
        bad = launch("tiny_nft_ocr", "actor.model.model_type=plug_tiny", model, override, "--dry-run", site=site,
                     log_root=tmp_path)
        assert bad.returncode != 0 and message in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_a_plugin_that_fails_to_import_is_one_line_and_breaks_nothing_else(tmp_path):
    site = install(tmp_path / "site", "brokenplug", {"family": "raise RuntimeError('no GPU driver here')\n",
                                                     "rewards": "import no_such_module_anywhere\n"},
                   "[rlrunner.model_families]\nbroken_family = brokenplug.family:BrokenFlowModel\n\n"
                   "[rlrunner.rewards]\nbroken_rewards = brokenplug.rewards\n")
    family_line = ("rlrunner: plugin entry point rlrunner.model_families 'broken_family = "
                   "brokenplug.family:BrokenFlowModel' failed to load: RuntimeError: no GPU driver here")
    reward_line = ("rlrunner: plugin entry point rlrunner.rewards 'broken_rewards = brokenplug.rewards' failed to "
                   "load: ModuleNotFoundError: No module named 'no_such_module_anywhere'")
    ok = launch("tiny_nft_ocr", "--dry-run", site=site, log_root=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert family_line in ok.stderr.splitlines() and reward_line in ok.stderr.splitlines()
    assert "Traceback" not in ok.stderr
    refused = launch("tiny_nft_ocr", "actor.model.model_type=broken_family", "--dry-run", site=site,
                     log_root=tmp_path)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    (error,) = [line for line in refused.stderr.splitlines() if line not in (family_line, reward_line)]
    assert error.endswith("actor.model.model_type='broken_family' is a plugin that failed to load: entry point "
                          "rlrunner.model_families 'broken_family = brokenplug.family:BrokenFlowModel' failed to "
                          "load: RuntimeError: no GPU driver here"), error
