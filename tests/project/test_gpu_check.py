"""bench/gpu_check.sh --tiny: the device check's own code on CPU with the model tests' tiny folders: the parts that go
through the launcher, and a failed part followed by one that runs in process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_check_rows import check_in_process_rows

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def gpu_check(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "PYTHON": sys.executable, "HOME": os.environ.get("HOME", str(cwd))}
    return subprocess.run(["bash", str(SCRIPT), "--tiny", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900, check=False)


@pytest.mark.slow
def test_tiny_check_runs_the_launched_parts_and_writes_the_table(tmp_path):
    """The parts that go through the launcher (runner, qwen), with their table and files. The in-process parts (ddp,
    fsdp2, wan) run in the offline rehearsal (tests/project/test_gpu_check_offline.py), the form a lent GPU runs;
    the next test runs wan after a failed part here."""
    result = gpu_check("--out", str(tmp_path / "out"), "--parts", "runner,qwen", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    rows = report["rows"]
    launched = ["sd3_nft_ocr (ddp over 1 rank): 2 steps, eval + save at 2",
                "sd3_nft_ocr (ddp over 1 rank): resume from step 2 to 3",
                "qwen_image_nft_ocr (fsdp2 over a one-rank mesh, offload): 2 steps, eval + save at 2",
                "qwen_image_nft_ocr (fsdp2 over a one-rank mesh, offload): resume from step 2 to 3"]
    assert [r["part"] for r in rows] == launched
    for r in rows:
        assert r["status"] == "ok" and r["images"] > 0 and r["s_per_step"] > 0 and r["peak_gib"] > 0, r
        assert r["images_per_gpu_s"] == pytest.approx(r["images"] / r["s_per_step"])
        assert r["simulated_gib"] > 0, r  # the launched runs carry the simulator's per-device peak for their settings
    assert report["memory"] == "host" and report["environment"]["torch"] and report["skipped"] == []
    assert report["parts"] == ["runner", "qwen"]
    header = ("| Part | # GPUs | Images | Throughput (images/GPU/s) | Time per Step (s) | Peak host memory (GiB) "
              "| Simulated peak (GiB) | MFU | Status |")
    assert header in result.stdout and "4 of 4 rows ok" in result.stdout
    assert header in (tmp_path / "out" / "gpu_check.md").read_text()
    for part in ("runner", "qwen"):
        assert json.loads((tmp_path / "out" / f"{part}.json").read_text())["status"] == "ok"
    # what comes back from a lent machine: the table, the JSON, the log and a file per part, none in a sub-folder
    # (the models were built elsewhere)
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["gpu_check.json", "gpu_check.log", "gpu_check.md", "qwen.json", "runner.json"]


@pytest.mark.slow
def test_a_failing_part_is_recorded_and_the_next_part_still_runs(tmp_path):
    models = tmp_path / "models"
    (models / "sd3").mkdir(parents=True)
    (models / "sd3" / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}))
    result = gpu_check("--out", str(tmp_path / "out"), "--models", str(models), "--parts", "ddp,wan", cwd=tmp_path)
    assert result.returncode == 1, result.stdout[-4000:]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    sd3, *wan = report["rows"]
    assert sd3["part"] == "sd3.5-m ddp" and sd3["status"].startswith("FAILED: ") and "sd3" in sd3["status"]
    check_in_process_rows(wan, "wan2.2-5b video ddp")  # built into --models, measured
    assert report["parts"] == ["ddp", "wan"] and (models / "wan22_ti2v_5b" / "model_index.json").is_file()
    assert "FAILED: sd3.5-m ddp" in result.stdout
