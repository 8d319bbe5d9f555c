"""Whether this Python environment is the lock: every package of requirements/cpu.lock at its pinned version, torch
at the version requirements/core.txt pins (any build), and nothing else but what that torch build requires.

    python scripts/lock_check.py                     # report; exit 1 when a package is missing or at another version
    python scripts/lock_check.py --remove-extras     # also uninstall what is neither locked nor torch's (env.sh)
    python scripts/lock_check.py --hash              # the lock's short hash, the stamp beside every measured figure

scripts/env.sh runs it after building .venv; tests/project/test_lock.py runs it on the environment the tests run in.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "cpu.lock"
CORE = ROOT / "requirements" / "core.txt"
#: installers that every environment has and the lock leaves to the environment
INSTALLERS = {"pip", "setuptools", "wheel"}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def canonical(name: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """``name == version`` lines of a requirements or lock file, by canonical name."""
    return {canonical(m[1]): m[2] for line in path.read_text().splitlines() if (m := PIN.match(line))}


def lock_hash(path: Path = LOCK) -> str:
    """The first 12 hex digits of the SHA-256 of the lock's sorted ``name==version`` pins: the environment's
    identity, unchanged by the lock's comments (which file asked for what) or its order."""
    pinned = "\n".join(f"{name}=={version}" for name, version in sorted(pins(path).items()))
    return hashlib.sha256(pinned.encode()).hexdigest()[:12]


def installed() -> dict[str, str]:
    return {canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions() if d.metadata["Name"]}


def requirement_closure(root: str, present: dict[str, str]) -> set[str]:
    """``root`` and every installed distribution its requirements reach (markers evaluated, no extras)."""
    from packaging.requirements import Requirement  # in the lock; imported here so that --hash needs nothing

    seen, todo = set(), [root]
    while todo:
        name = todo.pop()
        if name in seen or name not in present:
            continue
        seen.add(name)
        for line in importlib.metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonical(requirement.name))
    return seen


def differences(lock: Path) -> tuple[list[str], list[str]]:
    """(problems, extras): packages missing or at another version than locked, and packages nobody asked for."""
    locked, present = pins(lock), installed()
    locked_torch = pins(CORE)["torch"]
    problems = [f"{name}: locked {version}, installed {present.get(name, 'nothing')}"
                for name, version in sorted(locked.items()) if present.get(name) != version]
    torch = present.get("torch")
    if torch is None or torch.split("+")[0] != locked_torch:
        problems.append(f"torch: requirements/core.txt pins {locked_torch}, installed {torch or 'nothing'}")
    wanted = set(locked) | requirement_closure("torch", present) | INSTALLERS
    return problems, sorted(set(present) - wanted)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lock", type=Path, default=LOCK)
    parser.add_argument("--remove-extras", action="store_true", help="uninstall what neither the lock nor torch needs")
    parser.add_argument("--hash", action="store_true", help="print the lock's short hash and exit")
    args = parser.parse_args()
    if args.hash:
        print(lock_hash(args.lock))
        return 0
    problems, extras = differences(args.lock)
    if extras and args.remove_extras:
        print(f"lock_check: uninstalling what is neither in {args.lock.name} nor required by torch: {' '.join(extras)}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "--yes", "--quiet", *extras], check=True)
        problems, extras = differences(args.lock)
    consistent = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False)
    if consistent.returncode != 0:
        problems.append("pip check: " + consistent.stdout.strip().replace("\n", "; "))
    for line in problems:
        print(f"lock_check: {line}")
    if extras:
        print(f"lock_check: not in {args.lock.name} nor required by torch: {' '.join(extras)}")
    if not problems and not extras:
        print(f"lock_check: this environment is {args.lock.name} ({lock_hash(args.lock)}) with torch "
              f"{installed()['torch']}")
    return 1 if problems or extras else 0


if __name__ == "__main__":
    sys.exit(main())
