"""bench/gpu_check.sh --tiny: the device check's own code, every part, on CPU with the model tests' tiny folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def gpu_check(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "PYTHON": sys.executable, "HOME": os.environ.get("HOME", str(cwd))}
    return subprocess.run(["bash", str(SCRIPT), "--tiny", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900, check=False)


@pytest.mark.slow
@pytest.mark.longest
def test_tiny_check_runs_every_part_and_writes_the_table(tmp_path):
    result = gpu_check("--out", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    parts = [r["part"] for r in report["rows"]]
    expected = ["sd3.5-m rollout", "sd3.5-m NFT step", "sd3_nft_ocr (ddp over 1 rank): 2 steps, eval + save at 2",
                "sd3_nft_ocr (ddp over 1 rank): resume from step 2 to 3",
                "qwen_image_nft_ocr (fsdp2 over a one-rank mesh, offload): 2 steps, eval + save at 2",
                "qwen_image_nft_ocr (fsdp2 over a one-rank mesh, offload): resume from step 2 to 3",
                "wan2.2 image rollout", "wan2.2 image NFT step", "wan2.2 video rollout", "wan2.2 video NFT step"]
    assert [p for p, e in zip(parts, expected, strict=True) if not p.startswith(e)] == []
    for r in report["rows"]:
        assert r["status"] == "ok" and r["images"] > 0 and r["s_per_step"] > 0 and r["peak_gib"] > 0, r
        assert r["images_per_gpu_s"] == pytest.approx(r["images"] / r["s_per_step"])
        # the launched runs carry the simulator's prediction for their settings; the in-process parts do not
        launched = r["part"].startswith(("sd3_nft_ocr", "qwen_image_nft_ocr"))
        assert (r.get("simulated_gib") or 0) > 0 if launched else r.get("simulated_gib") is None, r
    assert report["memory"] == "host" and report["environment"]["torch"] and report["skipped"] == []
    header = ("| Part | # GPUs | Images | Throughput (images/GPU/s) | Time per Step (s) | Peak host memory (GiB) "
              "| Simulated peak (GiB) |")
    assert header in result.stdout and "10 of 10 rows ok" in result.stdout
    assert not (tmp_path / "out" / "models").exists()  # built for the run, removed after it


@pytest.mark.slow
def test_a_failing_part_is_recorded_and_the_next_part_still_runs(tmp_path):
    models = tmp_path / "models"
    (models / "sd3").mkdir(parents=True)
    (models / "sd3" / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}))
    result = gpu_check("--out", str(tmp_path / "out"), "--models", str(models), "--skip-runner", "--skip-qwen",
                       cwd=tmp_path)
    assert result.returncode == 1, result.stdout[-4000:]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    sd3, *wan = report["rows"]
    assert sd3["part"] == "sd3.5-m" and sd3["status"].startswith("FAILED: ") and "sd3" in sd3["status"]
    assert len(wan) == 4 and all(r["status"] == "ok" for r in wan)  # built into --models, measured
    assert report["skipped"] == ["runner", "qwen"] and (models / "wan22_ti2v_5b" / "model_index.json").is_file()
    assert "FAILED: sd3.5-m" in result.stdout
