"""Every benchmark runs as its docstring says from the project's virtual environment: here, its ``--help``."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "bench").iterdir() if p.suffix in (".py", ".sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_script_help_runs_from_a_checkout(script, tmp_path):
    command = ["bash", str(script), "--help"] if script.suffix == ".sh" else [sys.executable, str(script), "--help"]
    # from another directory and without PYTHONPATH, as a fresh clone's `.venv/bin/python bench/x.py` runs it
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


#: a benchmark's run in seconds, on what it reads without training (config-only model folders): it keeps working
#: through refactors of what it calls (bench/data_plane.py crashed when step_geometry gained its guidance argument)
QUICK_RUNS = {"data_plane.py": (["--recipe", "sd3_nft_ocr"], "8 ranks: a rank's bytes")}


@pytest.mark.parametrize("script", sorted(QUICK_RUNS))
def test_bench_script_runs_quickly(script, tmp_path):
    args, printed = QUICK_RUNS[script]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert printed in result.stdout
