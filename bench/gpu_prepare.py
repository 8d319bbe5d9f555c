"""The device check prepared for a machine without network (bench/gpu_check.sh --prepare DIR), here, with the registry.

    bash bench/gpu_check.sh --prepare .gpu_check                        # the lent GPU's: Python 3.12, manylinux x86_64
    bash bench/gpu_check.sh --prepare DIR --tiny --python-version 3.11  # the CPU rehearsal's (tests/, offline)

DIR receives:

* ``wheels/``: the wheels the check imports beyond the lent GPU image's packages (bench/lent_gpu_packages.txt), at
  the versions of requirements/cpu.lock, for ``--python-version`` and ``--platform`` (``pip download --no-deps
  --only-binary=:all:``), at most 40 MiB in all; each wheel's own requirements must be on the image or among them;
* ``simulated.json``: per in-process part (bench/gpu_parts.py), what ``bin/rlrunner plan --simulate`` predicts for
  the part's settings (its per-device JSON, phase by phase), computed on config-only folders at the check's sizes
  (bench/gpu_folders.py), with the simulation's FLOPs per phase and the step's sample counts;
* ``manifest.json``: the Python version and platforms, ``tiny``, the parts, each wheel's size and sha256, their
  total, the lock's sha256, the commit and the date.

It prints the wheels' total. ``--wheels-only`` skips the simulations; ``--simulations-only`` the wheels (what
bench/gpu_check.py runs when it is given no prepared folder).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "bench"))
from gpu_parts import PARTS, part_overrides, step_counts  # bench/ is not a package: imported by path

LOCK = ROOT / "requirements" / "cpu.lock"
IMAGE_PACKAGES = ROOT / "bench" / "lent_gpu_packages.txt"
#: what the check imports that the lent image lacks (rapidocr and Levenshtein with their own requirements)
WHEELS = ("diffusers", "omegaconf", "rapidocr", "pyclipper", "shapely", "colorlog", "levenshtein", "rapidfuzz")
#: requirements of those wheels that the check never imports, and why
NOT_NEEDED = {"importlib-metadata": "diffusers imports it on Python < 3.8 only"}
MAX_WHEEL_MIB = 40.0  # of the 64 MiB that travel to the lent machine, the working tree takes about 17
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
SIMULATED_DEVICE_GIB = 80.0  # "fits" in plan's JSON: an H100's memory (the prediction is what the check compares)


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lines(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def locked_versions(lock: Path = LOCK) -> dict[str, str]:
    """name -> pinned version of every ``name==version`` line of ``lock``."""
    pins = (re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line) for line in lock.read_text().splitlines())
    return {normalize(m.group(1)): m.group(2) for m in pins if m}


def pip_command() -> list[str]:
    """This Python's pip, else python3's (a venv built without pip): ``pip download`` for another Python and platform
    does not depend on the Python that runs it."""
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, check=False)
    if probe.returncode == 0:
        return [sys.executable, "-m", "pip"]
    python3 = shutil.which("python3")
    if python3 is None:
        raise FileNotFoundError(f"{sys.executable} has no pip and there is no python3 on PATH to download wheels with")
    return [python3, "-m", "pip"]


def download_wheels(folder: Path, python_version: str, platforms: list[str]) -> list[Path]:
    """The wheels of :data:`WHEELS` at the lock's versions for ``python_version`` and ``platforms``, in ``folder``."""
    pins = locked_versions()
    missing = [name for name in WHEELS if normalize(name) not in pins]
    if missing:
        raise ValueError(f"{LOCK} pins no version of {', '.join(missing)}; bench/gpu_prepare.py WHEELS names them")
    folder.mkdir(parents=True, exist_ok=True)
    command = [*pip_command(), "download", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
               "--implementation", "cp", *(f"--platform={p}" for p in platforms), "-d", str(folder),
               *(f"{name}=={pins[normalize(name)]}" for name in WHEELS)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-6:])
        raise RuntimeError(f"pip download for Python {python_version} {platforms[0]} failed:\n{tail}")
    wheels = sorted(folder.glob("*.whl"))
    found = {normalize(w.name.split("-")[0]) for w in wheels}
    if found != {normalize(name) for name in WHEELS}:
        raise RuntimeError(f"{folder} holds wheels of {sorted(found)}, expected exactly "
                           f"{sorted(map(normalize, WHEELS))} (one version each: remove the folder, prepare again)")
    return wheels


def unmet_requirements(wheels: list[Path], python_version: str) -> list[str]:
    """Each wheel's requirements (for ``python_version``, no extras) that neither the image nor the wheels provide."""
    import zipfile

    from packaging.requirements import Requirement

    have = {normalize(n) for n in read_lines(IMAGE_PACKAGES)} | {normalize(w.name.split("-")[0]) for w in wheels}
    environment = {"python_version": python_version, "python_full_version": f"{python_version}.0",
                   "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                   "os_name": "posix", "implementation_name": "cpython", "extra": ""}
    unmet = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            lines = archive.read(metadata).decode().splitlines()
        for line in lines:
            if not line.startswith("Requires-Dist:"):
                continue
            requirement = Requirement(line.removeprefix("Requires-Dist:").strip())
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            name = normalize(requirement.name)
            if name not in have and name not in NOT_NEEDED:
                unmet.append(f"{wheel.name} requires {requirement}")
    return unmet


def simulate_parts(parts: list[str], tiny: bool) -> dict[str, Any]:
    """part -> plan --simulate's prediction for the part's settings (module docstring), on config-only folders."""
    import torch
    from gpu_folders import build_all

    from rlrunner.recipe import load_recipe
    from rlrunner.sizing.sim_report import device_results, simulation_json
    from rlrunner.sizing.simulate import simulate_recipe

    results = {}
    with tempfile.TemporaryDirectory(prefix="rlrunner-gpu-prepare-") as scratch:
        families = tuple(sorted({PARTS[p].family for p in parts}))
        folders = build_all(Path(scratch), tiny=tiny, device=torch.device("cpu"), families=families,
                            configs_only=True)
        for part in parts:
            start = time.perf_counter()
            overrides = part_overrides(part, folders[PARTS[part].family], tiny)
            cfg = load_recipe(PARTS[part].recipe, overrides, check_datasets=False)
            placement, geometry, per_rank, n_train = step_counts(cfg)
            sim = simulate_recipe(cfg, geometry)
            swap = bool(cfg.cluster.enable_offload) and placement.is_collocated("actor", "rollout")
            devices = device_results(sim, placement, swap=swap)
            rollout, actor = sim.components["rollout"].flops, sim.components["actor"].flops
            device = devices[0]  # one device holds actor, rollout and env
            results[part] = {
                "recipe": PARTS[part].recipe, "overrides": settings(overrides),
                "samples_per_rollout_call": geometry.samples_per_rollout_call, "train_samples": n_train,
                # plan --simulate --json's object (GiB to 3 decimals), and its device's phases in bytes
                "plan": simulation_json(devices, int(SIMULATED_DEVICE_GIB * 2**30), sim.not_simulated),
                "phase_bytes": dict(device.phases),
                "activation_bytes": {phase: c.get("activations", 0) for phase, c in device.categories.items()},
                # the simulation scales the update's FLOPs to the step's samples; the check trains n_train of them
                "flops": {"rollout": rollout["rollout"], "decode": rollout["decode"],
                          "update": actor["update"] * n_train // per_rank},
                "seconds": round(time.perf_counter() - start, 1)}
            print(f"gpu_prepare: simulated {part} ({PARTS[part].recipe}) in {results[part]['seconds']:.0f}s: peak "
                  f"{device.peak / 2**30:.3f} GiB in {device.peak_phase}", flush=True)
    return results


def settings(overrides: list[str]) -> list[str]:
    """A part's overrides without its model folder's path: what must match between the simulation and the run."""
    return [o for o in overrides if not o.startswith("actor.model.model_path=")]


def commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="prepare the device check for a machine without network")
    parser.add_argument("--prepare", "--out", dest="out", type=Path, required=True, metavar="DIR",
                        help="the folder to fill (wheels/, simulated.json, manifest.json)")
    parser.add_argument("--tiny", action="store_true", help="simulate the tiny folders of the CPU rehearsal")
    parser.add_argument("--python-version", default="3.12", help="of the wheels (default 3.12, the lent GPU's)")
    parser.add_argument("--platform", nargs="+", default=list(PLATFORMS),
                        help="pip platform tags of the wheels (default manylinux x86_64, every glibc level)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"in-process parts to simulate, comma-separated (default all: {','.join(PARTS)})")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--wheels-only", action="store_true", help="download the wheels; no simulation")
    which.add_argument("--simulations-only", action="store_true", help="simulate the parts; no wheels")
    args = parser.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts {','.join(unknown)}: not an in-process part; choose from {','.join(PARTS)}")
    if not re.fullmatch(r"3\.\d+", args.python_version):
        parser.error(f"--python-version {args.python_version!r}: expected MAJOR.MINOR such as 3.12")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"tiny": args.tiny, "commit": commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                "lock_sha256": hashlib.sha256(LOCK.read_bytes()).hexdigest()}
    if not args.simulations_only:
        shutil.rmtree(args.out / "wheels", ignore_errors=True)  # one version of each: two would stop the install
        wheels = download_wheels(args.out / "wheels", args.python_version, args.platform)
        unmet = unmet_requirements(wheels, args.python_version)
        if unmet:
            raise RuntimeError("the prepared wheels need what the lent image lacks; add it to bench/gpu_prepare.py "
                               "WHEELS (or NOT_NEEDED, with why):\n  " + "\n  ".join(unmet))
        total = sum(w.stat().st_size for w in wheels)
        manifest.update(python_version=args.python_version, platforms=args.platform, total_bytes=total,
                        wheels=[{"file": w.name, "bytes": w.stat().st_size,
                                 "sha256": hashlib.sha256(w.read_bytes()).hexdigest()} for w in wheels])
        print(f"gpu_prepare: {len(wheels)} wheels for Python {args.python_version} in {args.out / 'wheels'}: "
              f"{total / 2**20:.1f} MiB (at most {MAX_WHEEL_MIB:.0f})", flush=True)
        if total > MAX_WHEEL_MIB * 2**20:
            raise RuntimeError(f"the wheels take {total / 2**20:.1f} MiB, over the {MAX_WHEEL_MIB:.0f} MiB that may "
                               f"travel with the working tree; drop one from bench/gpu_prepare.py WHEELS")
    if not args.wheels_only:
        manifest["parts"] = args.parts
        simulated = simulate_parts(args.parts, args.tiny)
        (args.out / "simulated.json").write_text(json.dumps(simulated, indent=2))
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
