"""RLinf's three diffusion recipes, copied with their defaults files into a config folder, run one step each through
the launcher on tiny model folders; only paths, batch sizes, resolution and run length are given on the command
line (tests/fixtures/rlinf/NOTICE: the files are RLinf's own)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from shell_helpers import clean_env

ROOT = Path(__file__).resolve().parents[2]
RLINF = ROOT / "tests/fixtures/rlinf/examples"
MODELS = {"sd3_nft_ocr": "sd3", "wan22_ti2v_5b_nft_ocr": "wan22_ti2v_5b", "wan22_ti2v_5b_nft_video_ocr": "wan22_ti2v_5b"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Path:
    """A user's config folder (RLinf's diffusion config with hybrid_engines/ and weight_syncer/ beside env/ and
    model/), tiny SD3 and Wan folders and a prompt folder."""
    from tiny_pipelines import write_tiny_sd3, write_tiny_wan

    root = tmp_path_factory.mktemp("rlinf")
    config = shutil.copytree(RLINF / "diffusion/config", root / "config")
    for group in ("hybrid_engines", "weight_syncer"):
        shutil.copytree(RLINF / "embodiment/config" / group, config / group)
    write_tiny_sd3(root / "sd3")
    write_tiny_wan(root / "wan22_ti2v_5b")
    (root / "data").mkdir()
    for split in ("train", "test"):
        (root / "data" / f"{split}.txt").write_text('a sign that says "ab"\na sign that says "cd"\n')
    return root


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(MODELS))
def test_rlinf_recipe_runs_one_step_through_the_launcher(setup, recipe, tmp_path):
    family = MODELS[recipe]
    resolution = "16" if family == "sd3" else "[32,32]"
    overrides = [f"actor.model.model_path={setup / family}", f"env.train.dataset.path={setup / 'data'}",
                 f"env.eval.dataset.path={setup / 'data'}", "runner.max_steps=1", "algorithm.group_size=2",
                 "env.train.total_num_envs=2", "env.train.rollout_epoch=1", "env.eval.total_num_envs=1",
                 "actor.micro_batch_size=1", "actor.global_batch_size=2", f"actor.model.{family}.resolution={resolution}"]
    env = {**clean_env(), "PYTHON": sys.executable, "RLRUNNER_LOG_ROOT": str(tmp_path / "logs")}
    result = subprocess.run(["bash", str(ROOT / "examples/diffusion/run_diffusion.sh"),
                             str(setup / "config" / f"{recipe}.yaml"), *overrides], check=False, cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sum("RLinf keys accepted that change nothing here" in line for line in result.stderr.splitlines()) == 1
    (run_dir,) = (tmp_path / "logs").iterdir()
    assert run_dir.name.endswith(f"-{recipe}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "env/avg" in r] == [1]
    assert not [r for r in records if "eval/avg" in r]  # val_check_interval: -1 = never
    assert not (run_dir / "checkpoints").exists()  # save_interval: -1 = never
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["runner"]["log_dir"] == str(run_dir.resolve())
    assert saved["runner"]["logger"]["experiment_name"] == recipe
    assert (saved["actor"]["strategy"], saved["cluster"]["enable_offload"]) == ("fsdp2", True)
