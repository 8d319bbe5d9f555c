"""Running the project's commands as a user's fresh shell would: no virtualenv active or on PATH."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def clean_env() -> dict[str, str]:
    """A fresh shell's environment: no virtualenv active or on PATH. scripts/env.sh then picks the project's .venv;
    where the tests run in another environment (no .venv), PYTHON names it, as a user of their own would. Ray's
    workers compute at the tests' priority (tests/conftest.py), not at Ray's nice 15 beside the other test process."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
           "RAY_worker_niceness": os.environ.get("RAY_worker_niceness", "0")}
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        env["PYTHON"] = sys.executable
    return env
