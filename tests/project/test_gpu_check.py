"""bench/gpu_check.sh --tiny: the device check's own code, every part, on CPU with the model tests' tiny folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
PHASES = ("actor_load", "rollout_load", "rollout", "decode", "update", "ema", "weight_sync")
#: the rows of one in-process part, in order (bench/gpu_parts.py)
STEPS = ("load actor", "rollout (", "VAE decode", "OCR reward", "NFT update", "EMA + weight sync",
         "offload round trip")
#: rows measuring images per second, and the phases whose simulated peak they carry
THROUGHPUT = ("rollout (", "VAE decode", "OCR reward", "NFT update")
SIMULATED = ("load actor", "rollout (", "VAE decode", "NFT update", "EMA + weight sync")


def gpu_check(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "PYTHON": sys.executable, "HOME": os.environ.get("HOME", str(cwd))}
    return subprocess.run(["bash", str(SCRIPT), "--tiny", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900, check=False)


def check_in_process_rows(rows: list[dict], label: str) -> None:
    """The rows of one in-process part: every step ok, throughput and simulated peaks where they belong."""
    assert [r["part"] for r in rows if not r["part"].startswith(label)] == []
    steps = [r["part"].removeprefix(f"{label}: ") for r in rows]
    assert [s for s, e in zip(steps, STEPS, strict=True) if not s.startswith(e)] == []
    for r, step in zip(rows, STEPS, strict=True):
        assert r["status"] == "ok" and r["s_per_step"] > 0, r
        if step in THROUGHPUT:
            assert r["images"] > 0 and r["images_per_gpu_s"] == pytest.approx(r["images"] / r["s_per_step"]), r
        # the phases' memory: host RSS on CPU (the device's allocated peak on a GPU), beside plan --simulate's
        if step in SIMULATED:
            assert r["peak_gib"] > 0 and r["simulated_gib"] > 0, r
        assert r["mfu"] is None, r  # no GPU, no peak FLOP/s to divide by


@pytest.mark.slow
@pytest.mark.longest
def test_tiny_check_runs_every_part_and_writes_the_table(tmp_path):
    result = gpu_check("--out", str(tmp_path / "out"), "--parts", "ddp,fsdp2,wan,runner,qwen", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    rows = report["rows"]
    check_in_process_rows(rows[0:7], "sd3.5-m ddp")
    check_in_process_rows(rows[7:14], "sd3.5-m fsdp2")
    check_in_process_rows(rows[14:21], "wan2.2-5b video ddp")
    assert "ddp over a one-rank gloo group" in rows[4]["part"]
    assert "fsdp2 over a one-rank gloo group" in rows[11]["part"]
    launched = ["sd3_nft_ocr (ddp over 1 rank): 2 steps, eval + save at 2",
                "sd3_nft_ocr (ddp over 1 rank): resume from step 2 to 3",
                "qwen_image_nft_ocr (fsdp2 over a one-rank mesh, offload): 2 steps, eval + save at 2",
                "qwen_image_nft_ocr (fsdp2 over a one-rank mesh, offload): resume from step 2 to 3"]
    assert [r["part"] for r in rows[21:]] == launched
    for r in rows[21:]:
        assert r["status"] == "ok" and r["images"] > 0 and r["s_per_step"] > 0 and r["peak_gib"] > 0, r
        assert r["images_per_gpu_s"] == pytest.approx(r["images"] / r["s_per_step"])
        assert r["simulated_gib"] > 0, r  # the launched runs carry the simulator's per-device peak for their settings
    for part in ("ddp", "fsdp2", "wan"):  # every phase measured, beside the simulation computed before the parts
        phases = report["phases"][part]
        assert sorted(phases) == sorted(PHASES), part
        assert all(p["simulated_gib"] > 0 and p["seconds"] and p["peak_gib"] > 0 for p in phases.values()), phases
        assert len(phases["rollout"]["seconds"]) == 2 and len(phases["update"]["seconds"]) == 2  # cold, then warm
        assert json.loads((tmp_path / "out" / f"{part}.json").read_text())["status"] == "ok"
    assert report["memory"] == "host" and report["environment"]["torch"] and report["skipped"] == []
    header = ("| Part | # GPUs | Images | Throughput (images/GPU/s) | Time per Step (s) | Peak host memory (GiB) "
              "| Simulated peak (GiB) | MFU | Status |")
    assert header in result.stdout and "25 of 25 rows ok" in result.stdout
    assert header in (tmp_path / "out" / "gpu_check.md").read_text()
    # what comes back from a lent machine: at most 8 files, none in a sub-folder (the models were built elsewhere)
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["ddp.json", "fsdp2.json", "gpu_check.json", "gpu_check.log", "gpu_check.md", "qwen.json",
                     "runner.json", "wan.json"]


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
