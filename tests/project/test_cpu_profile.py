"""tests/helpers/cpu_profile.py, the suite's CPU meter: a test's CPU counts what its own process and the processes it
starts spend, one line per test, in a file of this run only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
SPIN = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end:\n    pass\n"


def test_each_test_counts_its_own_cpu_and_its_subprocesses(tmp_path):
    (tmp_path / "test_spin.py").write_text(
        "import subprocess, sys\n\n"
        f"def test_in_process():\n    exec({SPIN.format(seconds=0.6)!r})\n\n"
        f"def test_in_a_subprocess():\n    subprocess.run([sys.executable, '-c', {SPIN.format(seconds=1.2)!r}], "
        "check=True)\n\n"
        "def test_idle():\n    pass\n")
    out = tmp_path / "cpu.jsonl"
    out.write_text('{"id": "a stale line of an earlier run"}\n')
    env = {**os.environ, "PYTHONPATH": str(HELPERS), "RLRUNNER_CPU_PROFILE": str(out)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "cpu_profile", "-q", "-p", "no:cacheprovider",
                           "test_spin.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout[-2000:]
    records = {r["id"].split("::")[1]: r for r in map(json.loads, out.read_text().splitlines())}
    assert records.keys() == {"test_in_process", "test_in_a_subprocess", "test_idle"}
    assert records["test_in_process"]["cpu_s"] >= 0.55 and records["test_in_process"]["processes"] == 0
    # its last poll interval (0.25 s) may be missed
    assert records["test_in_a_subprocess"]["cpu_s"] >= 0.9 and records["test_in_a_subprocess"]["processes"] == 1
    assert records["test_idle"]["cpu_s"] < 0.3
    assert "CPU per test" in done.stdout and "test_spin.py::test_in_a_subprocess" in done.stdout
