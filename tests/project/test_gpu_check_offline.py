"""The device check's offline path, rehearsed on CPU as the lent GPU runs it (bench/gpu_check.sh --offline).

The lent machine has no network, no Ray and none of diffusers, OmegaConf, RapidOCR or Levenshtein; it gets the wheels
that ``bash bench/gpu_check.sh --prepare DIR`` downloaded here (at most 40 MiB) and the simulations computed here.
This test prepares such a folder for the local Python with ``--tiny``, then runs ``--offline DIR --tiny`` with:

* no network: in a new network namespace (``unshare -n``; skipped with the reason where it cannot be made);
* the lent image imitated: a Python (a venv of this interpreter) that holds only this environment's distributions the
  image has (bench/lent_gpu_packages.txt, with what those need here), so that Ray is unimportable and diffusers and the
  rest must come from the prepared wheels, installed with no index;

and checks that each part's result, the table and the JSON are in the output folder, each part's as it ends. Preparing
needs the registry: without it the tests are skipped with the reason, or fail when the environment variable CI is set.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from gpu_check_rows import PHASES, check_in_process_parts

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"
IMAGE_PACKAGES = ROOT / "bench" / "lent_gpu_packages.txt"
PARTS = ("ddp", "fsdp2", "wan")
MAX_WHEEL_MIB = 40


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_closure() -> set[str]:
    """The lent image's distributions installed here with every requirement of theirs installed here: on the image
    each brings its own (this environment's huggingface-hub needs packages the image's older one does not)."""
    from packaging.requirements import Requirement

    installed = {normalize(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    todo = [normalize(line.strip()) for line in IMAGE_PACKAGES.read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in installed:
            continue
        seen.add(name)
        for text in installed[name].requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(normalize(requirement.name))
    return seen


def lent_image_python(folder: Path) -> Path:
    """A Python of this interpreter whose packages are only this environment's distributions that the lent image has
    (with what they need here): a venv whose site-packages links to their files. Ray and everything else the image
    lacks are simply absent, as there (``importlib.util.find_spec`` gives None)."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    allowed = image_closure()
    entries: dict[bool, set[str]] = {True: set(), False: set()}  # allowed or not -> top-level names of their files
    for dist in importlib.metadata.distributions():
        entries[normalize(dist.metadata["Name"]) in allowed].update(f.parts[0] for f in dist.files or [])
    hidden = entries[False] - entries[True]  # a namespace both use (google/) stays
    site = Path(sysconfig.get_paths()["purelib"])
    target = Path(sysconfig.get_paths(vars={"base": str(folder), "platbase": str(folder)})["purelib"])
    for entry in site.iterdir():
        if entry.name not in hidden:
            (target / entry.name).symlink_to(entry)
    python = folder / "bin" / "python"
    code = "import importlib.util as u; print(*(u.find_spec(m) is not None for m in ('ray', 'diffusers', 'torch')))"
    probe = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert probe.stdout.split() == ["False", "False", "True"], probe.stdout + probe.stderr
    return python


def prepare(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--prepare", str(folder), *args], cwd=ROOT,
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=900,
                          check=False)


def registry_or_skip(folder: Path) -> None:
    """Skip (fail under CI) when the registry pip uses here cannot give one wheel of the lock."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_prepare import locked_versions, pip_command

    probe = subprocess.run([*pip_command(), "download", "--no-deps", "--only-binary=:all:", "-d", str(folder),
                            f"colorlog=={locked_versions()['colorlog']}"], capture_output=True, text=True,
                           timeout=300, check=False)
    if probe.returncode != 0:
        reason = f"the package registry cannot be reached: {probe.stderr.strip().splitlines()[-1:]}"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set and {reason}")
        pytest.skip(reason)


def no_network_prefix() -> list[str]:
    """A command prefix that runs in a new network namespace with only loopback up, or a skip with the reason: as
    root ``unshare -n``, else in a user namespace of its own (``-rn``) where the system allows one."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare command: the network cannot be taken away here")
    errors = []
    for flags in ("-n", "-rn"):
        tried = subprocess.run([unshare, flags, "true"], capture_output=True, text=True, check=False)
        if tried.returncode == 0:
            # loopback up, as on any machine (gloo's group of one binds to it); the namespace has no other interface
            return [unshare, flags, "sh", "-c", 'ip link set lo up 2>/dev/null || true; exec "$@"', "sh"]
        errors.append(f"unshare {flags}: {tried.stderr.strip()}")
    pytest.skip(f"no network namespace can be made here ({'; '.join(errors)})")


def mib(manifest: Path) -> float:
    return json.loads(manifest.read_text())["total_bytes"] / 2**20


def test_the_lent_gpus_wheels_fit(tmp_path):
    registry_or_skip(tmp_path / "probe")
    result = prepare(tmp_path / "prepared", "--wheels-only")  # the defaults: Python 3.12, manylinux x86_64
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    manifest = json.loads((tmp_path / "prepared" / "manifest.json").read_text())
    assert manifest["python_version"] == "3.12" and mib(tmp_path / "prepared" / "manifest.json") <= MAX_WHEEL_MIB
    names = sorted(normalize(w["file"].split("-")[0]) for w in manifest["wheels"])
    assert names == ["colorlog", "diffusers", "levenshtein", "omegaconf", "pyclipper", "rapidfuzz", "rapidocr",
                     "shapely"]
    assert all("cp312" in w["file"] or "py3-none-any" in w["file"] for w in manifest["wheels"])
    assert f"{mib(tmp_path / 'prepared' / 'manifest.json'):.1f} MiB" in result.stdout


def test_the_offline_check_runs_without_ray_network_or_the_environments_packages(tmp_path):
    registry_or_skip(tmp_path / "probe")
    prefix = no_network_prefix()
    prepared, out = tmp_path / "prepared", tmp_path / "out"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    platforms = [p.replace("x86_64", platform.machine()) for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                                                                   "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
                                                                   "manylinux2014_x86_64")]
    result = prepare(prepared, "--tiny", "--python-version", version, "--platform", *platforms)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert mib(prepared / "manifest.json") <= MAX_WHEEL_MIB
    simulated = json.loads((prepared / "simulated.json").read_text())
    assert sorted(simulated) == sorted(PARTS)
    assert all(sorted(s["phase_bytes"]) == sorted(PHASES) and min(s["phase_bytes"].values()) > 0
               for s in simulated.values()), simulated

    python = lent_image_python(tmp_path / "lent-image")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": str(python), "TMPDIR": str(tmp_path)}
    started = time.time()
    with (tmp_path / "stdout.txt").open("w") as stdout:
        command = [*prefix, "bash", str(SCRIPT), "--offline", str(prepared), "--tiny", "--out", str(out)]
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=stdout, stderr=subprocess.STDOUT, text=True)
        present_at_start = watch_parts(proc, out, timeout=900)
    text = (tmp_path / "stdout.txt").read_text()
    assert proc.returncode == 0, text[-6000:]

    # each part's result was in the folder when the next part started, and all of them are at the end
    assert present_at_start == {"fsdp2": ["ddp"], "wan": ["ddp", "fsdp2"]}, present_at_start
    assert sorted(p.name for p in out.iterdir()) == ["ddp.json", "fsdp2.json", "gpu_check.json", "gpu_check.log",
                                                     "gpu_check.md", "wan.json"]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["prepared"] == str(prepared) and report["skipped"] == []
    assert all(r["status"] == "ok" for r in report["rows"]) and len(report["rows"]) == 21
    check_in_process_parts(report)  # each step's throughput, memory and simulated peak, each phase
    assert "21 of 21 rows ok" in text
    for part in PARTS:
        result = json.loads((out / f"{part}.json").read_text())
        assert result["status"] == "ok" and len(result["rows"]) == 7
        assert sorted(result["phases"]) == sorted(PHASES)
        assert all(p["simulated_gib"] > 0 for p in result["phases"].values()), result["phases"]
    assert "| Part | # GPUs | Images |" in (out / "gpu_check.md").read_text()
    assert "| Part | Phase | Seconds |" in (out / "gpu_check.md").read_text()

    # no Ray, and the carried modules came from the prepared wheels, installed in a temporary folder removed after
    environment = report["environment"]
    assert environment["ray"] == "not importable" and environment["python_executable"] == str(python)
    for module, where in environment["carried"].items():
        assert where.split(" from ")[1].startswith(str(tmp_path / "rlrunner-gpu-site.")), (module, where)
    assert not Path(environment["carried"]["diffusers"].split(" from ")[1]).exists()
    assert not [p for p in (ROOT / "logs").glob("gpu_check-*") if p.stat().st_mtime >= started]


def watch_parts(proc: subprocess.Popen, out: Path, timeout: float) -> dict[str, list[str]]:
    """Wait for ``proc``; part -> the part results in ``out`` (and in its gpu_check.json) when that part started."""
    present: dict[str, list[str]] = {}
    log = out / "gpu_check.log"
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        started = re.findall(r"^gpu_check: part (\w+)", log.read_text() if log.is_file() else "", re.MULTILINE)
        for part in started:
            if part not in present and part != PARTS[0]:
                report = json.loads((out / "gpu_check.json").read_text())
                present[part] = sorted(p for p in PARTS if (out / f"{p}.json").is_file() and p in report["phases"])
    if proc.poll() is None:
        proc.kill()
        pytest.fail(f"the offline check ran over {timeout:.0f}s")
    return present
