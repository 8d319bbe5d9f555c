"""scripts/env.sh picks a user's own environment for the launcher when what a run imports is there: pytest, a
test-only dependency, is asked for only by scripts/test.sh."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


def _checkout_with_a_venv(tmp_path: Path) -> Path:
    """env.sh's folder with a .venv whose python would fail every probe: a run must not reach it."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "scripts", checkout / "scripts")
    shutil.copytree(ROOT / "requirements", checkout / "requirements")
    venv_python = checkout / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("#!/bin/sh\nexit 9\n")
    venv_python.chmod(0o755)
    return checkout


def _fake_python(path: Path, lacks: str) -> Path:
    """A python whose import probes pass, except for module ``lacks``, which it reports as Python would."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\ncase "$*" in *"{lacks}"*) echo "ModuleNotFoundError: No module named '
                    f"'{lacks}'\" >&2; exit 1;; *\"import torch\"*) exit 0;; esac\nexit 2\n")
    path.chmod(0o755)
    return path


def _pick(checkout: Path, python: Path, purpose: str = "run") -> subprocess.CompletedProcess:
    script = f'source {checkout}/scripts/env.sh\nrlrunner_pick_python {purpose} || exit $?\necho "PY=$PY"\n'
    return subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin", "PYTHON": str(python)},
                          capture_output=True, text=True, timeout=300, check=False)


def test_python_is_used_whenever_it_is_set_even_beside_a_venv(tmp_path):
    checkout = _checkout_with_a_venv(tmp_path)
    python = _fake_python(tmp_path / "gpu" / "bin" / "python3", lacks="pytest")
    done = _pick(checkout, python)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"PY={python}"]


def test_a_python_that_lacks_a_requirement_is_refused_with_what_it_lacks(tmp_path):
    checkout = _checkout_with_a_venv(tmp_path)
    python = _fake_python(tmp_path / "gpu" / "bin" / "python3", lacks="omegaconf")
    done = _pick(checkout, python)
    assert done.returncode == 2 and not done.stdout
    assert f"PYTHON={python} lacks rlrunner's requirements (ModuleNotFoundError: No module named 'omegaconf')" in done.stderr
    tools = _pick(checkout, _fake_python(tmp_path / "cpu" / "bin" / "python3", lacks="pytest"), "test")
    assert tools.returncode == 2 and "No module named 'pytest'" in tools.stderr
    assert "install requirements/dev.txt (the test tools) there" in tools.stderr
    missing = _pick(checkout, tmp_path / "nowhere" / "python3")
    assert missing.returncode == 2 and "is not a python on this machine" in missing.stderr
