"""What a part of bench/gpu_check.sh that runs in process writes (bench/gpu_parts.py), checked by the tests of its
CPU form (tests/project/test_gpu_check.py) and of its offline form (tests/project/test_gpu_check_offline.py)."""

from __future__ import annotations

import pytest

PHASES = ("actor_load", "rollout_load", "rollout", "decode", "update", "ema", "weight_sync")
#: the rows of one in-process part, in order (bench/gpu_parts.py)
STEPS = ("load actor", "rollout (", "VAE decode", "OCR reward", "NFT update", "EMA + weight sync",
         "offload round trip")
#: rows measuring images per second, and the phases whose simulated peak they carry
THROUGHPUT = ("rollout (", "VAE decode", "OCR reward", "NFT update")
SIMULATED = ("load actor", "rollout (", "VAE decode", "NFT update", "EMA + weight sync")


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


def check_in_process_parts(report: dict) -> None:
    """The rows and phases of the in-process parts ddp, fsdp2 and wan, in that order, in ``gpu_check.json``."""
    rows = report["rows"]
    check_in_process_rows(rows[0:7], "sd3.5-m ddp")
    check_in_process_rows(rows[7:14], "sd3.5-m fsdp2")
    check_in_process_rows(rows[14:21], "wan2.2-5b video ddp")
    assert "ddp over a one-rank gloo group" in rows[4]["part"]
    assert "fsdp2 over a one-rank gloo group" in rows[11]["part"]
    for part in ("ddp", "fsdp2", "wan"):  # every phase measured, beside the simulation computed before the parts
        phases = report["phases"][part]
        assert sorted(phases) == sorted(PHASES), part
        assert all(p["simulated_gib"] > 0 and p["seconds"] and p["peak_gib"] > 0 for p in phases.values()), phases
        assert len(phases["rollout"]["seconds"]) == 2 and len(phases["update"]["seconds"]) == 2  # cold, then warm
