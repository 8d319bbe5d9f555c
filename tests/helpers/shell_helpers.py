"""Running the project's commands as a user's fresh shell would: no virtualenv active or on PATH; and running the
Python command a shell script hands over in the test's own process (:func:`run_handed_in_process`)."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
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


#: the Python bin/rlrunner and the launcher are given by :func:`run_handed_in_process`: it passes their check of the
#: environment (``-c``, scripts/env.sh) and records the command they hand to Python, NUL-separated, in $RLRUNNER_RECORD
RECORDING_PYTHON = """#!/bin/sh
[ "$1" = -c ] && exit 0
printf '%s\\0' "$@" > "$RLRUNNER_RECORD"
"""


def run_handed_in_process(command: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """``command`` (bin/rlrunner or the launcher, run for real from the repository's root) with a Python that records
    what it is handed, then that ``python -m rlrunner.commands.<name> ...`` as ``main(args)`` in this process under
    ``env``, instead of a new Python that spends seconds importing the stack. Where the script answers before
    Python (its own ``--help``, a refusal), the script's own result."""
    with tempfile.TemporaryDirectory(prefix="rlrunner-handed-") as scratch:
        python, record = Path(scratch) / "recording-python", Path(scratch) / "python-argv"
        python.write_text(RECORDING_PYTHON)
        python.chmod(0o755)
        shell = subprocess.run(command, cwd=ROOT, env={**env, "PYTHON": str(python), "RLRUNNER_RECORD": str(record)},
                               text=True, capture_output=True, timeout=timeout, check=False)
        if not record.is_file():
            return shell
        handed = record.read_text().split("\0")[:-1]
    handed = handed[1:] if handed[0] == "-u" else handed
    assert handed[0] == "-m" and handed[1].startswith("rlrunner.commands."), f"{command}: handed Python {handed}"
    out, err = io.StringIO(), io.StringIO()
    with _environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = importlib.import_module(handed[1]).main(handed[2:])
        except SystemExit as exit_:  # argparse's --help and errors
            code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
    return subprocess.CompletedProcess(command, code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """``os.environ`` is ``env`` inside (what the command would have been started with)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
