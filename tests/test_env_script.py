"""scripts/env.sh picks a user's own environment for the launcher when what a run imports is there: pytest, a
test-only dependency, is asked for only by scripts/test.sh."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_launcher_takes_an_environment_without_pytest_and_the_tests_do_not(tmp_path):
    checkout = tmp_path / "checkout"  # env.sh's folder, without a .venv: the current environment is tried first
    shutil.copytree(ROOT / "scripts", checkout / "scripts")
    shutil.copytree(ROOT / "requirements", checkout / "requirements")
    # a GPU user's environment, as env.sh's import probes see it: everything a run imports, but no pytest
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_text('#!/bin/sh\ncase "$*" in *"import pytest"*) exit 1;; *"import torch"*) exit 0;; esac\nexit 2\n')
    python.chmod(0o755)
    script = (f'source {checkout}/scripts/env.sh\nrlrunner_env_ok "$PYTHON" || exit 3\nrlrunner_pick_python\n'
              'echo "PY=$PY"\nrlrunner_env_ok "$PYTHON" test && echo "test: ok" || echo "test: lacks pytest"\n')
    done = subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin", "PYTHON": str(python)},
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"PY={python}", "test: lacks pytest"]
    assert not (checkout / ".venv").exists()
