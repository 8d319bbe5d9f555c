"""Where a measured figure comes from, in one line for the table beside it: the date, the lock's hash, the torch
build, the CPU and the commit. A figure reproduces in the same lock with the same torch build on the same kind of CPU
(docs/install.md "The lock").

    bin/rlrunner python bench/provenance.py      # the stamp of this checkout and environment, as the tables print it
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lock_hash() -> str:
    spec = importlib.util.spec_from_file_location("lock_check", ROOT / "scripts" / "lock_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.lock_hash()


def cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.is_file() else []
    return names[0] if names else platform.processor() or platform.machine()


def provenance() -> str:
    """``2026-12-07, lock b909c8c3fe39, torch 2.13.0+cpu, <CPU> x 2, commit abc1234``."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    return (f"{time.strftime('%Y-%m-%d')}, lock {lock_hash()}, torch {importlib.metadata.version('torch')}, "
            f"{cpu_model()} x {os.cpu_count()}, commit {commit or 'unknown'}")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    print(provenance())
