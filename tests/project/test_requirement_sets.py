"""requirements/gpu.txt and requirements/npu.txt resolve from the package registry beside core.txt's torch (issue 52).

Each set is resolved as a user installs it, ``pip install --dry-run --report -r <set> torch==<core.txt's>``, against the
registry alone: this machine's pip configuration (local wheels, extra indexes, constraints) is left out, so that torch
resolves to the registry's CUDA build with its nvidia-* libraries, as on a GPU machine. The checks:

1. both sets resolve;
2. the GPU set holds no CUDA library that torch does not require itself (followed through the report's requirements,
   markers and extras), so at the versions torch pins, and one of each (no second NCCL or cuDNN, no other CUDA major);
3. the GPU set holds its OCR engine (RapidOCR on onnxruntime-gpu) and the NPU set torch-npu of torch's release;
4. no set installs two distributions of one import package (onnxruntime beside onnxruntime-gpu, two OpenCV builds):
   both write the same files, and whichever pip writes last wins (with both in one ``pip install``, the CPU build of
   onnxruntime did, and the CUDA provider was gone).

The two resolutions run at once, about 50 s of CPU time between them: 100-120 s of wall time on this project's 2-core
machine while other jobs kept it at a load of 8-10 (2026-12-07). They need the registry: when it cannot be reached the
tests are skipped with the reason, or fail when the environment variable CI is set.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements"
#: the GPU set's OCR engine (docs/rewards.md): RapidOCR on the CUDA build of ONNX Runtime
GPU_OCR_ENGINE = ("rapidocr", "onnxruntime-gpu")
#: distributions that install the same import package; a set may hold at most one of each group
SAME_IMPORT = {
    "onnxruntime": {"onnxruntime", "onnxruntime-gpu"},
    "cv2": {"opencv-python", "opencv-python-headless", "opencv-contrib-python", "opencv-contrib-python-headless"},
}
#: pip settings that point at sources other than the registry's index (this machine's local wheels and mirrors)
LOCAL_SOURCES = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_CONSTRAINT", "PIP_CONFIG_FILE")
RESOLVE_TIMEOUT_S = 300


def core_torch() -> str:
    """core.txt's torch requirement, ``torch==X``: the torch every set is resolved beside."""
    for line in (REQUIREMENTS / "core.txt").read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        if requirement.startswith("torch=="):
            return requirement
    raise AssertionError("requirements/core.txt pins no torch== line")


def registry_env() -> dict[str, str]:
    """This environment without the pip settings of local sources, and no pip configuration file."""
    env = {key: value for key, value in os.environ.items() if key not in LOCAL_SOURCES}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", *args]


def unreachable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI is set and {reason}")
    pytest.skip(reason)


def name(raw: str) -> str:
    """A distribution name, normalised (PEP 503)."""
    return re.sub(r"[-_.]+", "-", raw).lower()


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """pip's installation report (``install``: one item per distribution, ``environment``: the markers) of ``gpu``
    and ``npu``, each with core.txt's torch."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        pytest.skip("the GPU and NPU sets are resolved for Linux x86_64, where their CUDA and torch-npu wheels are")
    env = registry_env()
    probe = subprocess.run(pip("index", "versions", "pip", "--timeout", "15", "--retries", "1"), env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    if probe.returncode != 0:
        first = (probe.stderr.strip().splitlines() or ["no output"])[0]
        unreachable(f"the package registry cannot be reached (pip index versions pip: {first[:300]})")
    folder = tmp_path_factory.mktemp("requirement_sets")
    sets = {"gpu": ["-r", str(REQUIREMENTS / "gpu.txt")], "npu": ["-r", str(REQUIREMENTS / "npu.txt")]}
    running = {
        key: subprocess.Popen(
            pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(folder / f"{key}.json"),
                *args, core_torch()),
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for key, args in sets.items()
    }
    try:
        errors = {key: process.communicate(timeout=RESOLVE_TIMEOUT_S)[1] for key, process in running.items()}
    finally:
        for process in running.values():
            process.kill()  # after a timeout; a no-op for the processes that ended
    for key, process in running.items():
        assert process.returncode == 0, f"requirements/{key}.txt does not resolve:\n{errors[key][-3000:]}"
    return {key: json.loads((folder / f"{key}.json").read_text()) for key in sets}


def versions(report: dict) -> dict[str, str]:
    """``{distribution: version}`` of a report."""
    return {name(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}


def required_by(report: dict, root: str) -> set[str]:
    """The distributions of ``report`` that ``root`` requires, directly or through others, as pip followed them: each
    requirement whose marker holds in the report's environment for the extras asked of its distribution."""
    metadata = {name(item["metadata"]["name"]): item["metadata"] for item in report["install"]}
    seen: set[tuple[str, frozenset[str]]] = set()
    stack = [(root, frozenset[str]())]
    while stack:
        dist, extras = stack.pop()
        if (dist, extras) in seen:
            continue
        seen.add((dist, extras))
        environments = [{**report["environment"], "extra": extra} for extra in extras or {""}]
        for line in metadata[dist].get("requires_dist") or []:
            requirement = Requirement(line)
            wanted = name(requirement.name)
            if wanted in metadata and (
                requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments)
            ):
                stack.append((wanted, frozenset(requirement.extras)))
    return {dist for dist, _ in seen}


def cuda_libraries(resolved: dict[str, str]) -> dict[str, str]:
    """The CUDA wheels (``nvidia-*``, ``cuda-*``) of ``{distribution: version}``."""
    return {dist: version for dist, version in resolved.items() if dist.startswith(("nvidia-", "cuda-"))}


def library(dist: str) -> str:
    """The library a CUDA wheel holds, whatever its CUDA major: nvidia-cudnn-cu12 and nvidia-cudnn-cu13 -> cudnn."""
    return re.sub(r"-cu\d+$", "", dist.removeprefix("nvidia-"))


def test_the_gpu_set_keeps_torchs_cuda_libraries(reports) -> None:
    gpu_libs = cuda_libraries(versions(reports["gpu"]))
    torchs = required_by(reports["gpu"], "torch")
    assert {"nccl", "cudnn"} <= {library(dist) for dist in torchs}, (
        f"{core_torch()} resolved without NCCL and cuDNN wheels, so not to the registry's CUDA build: {gpu_libs}")
    foreign = {dist: version for dist, version in gpu_libs.items() if dist not in torchs}
    assert not foreign, f"requirements/gpu.txt adds CUDA libraries that torch does not require: {foreign}"
    libraries = [library(dist) for dist in gpu_libs if dist.startswith("nvidia-")]
    assert len(libraries) == len(set(libraries)), f"a CUDA library twice: {sorted(gpu_libs)}"


def test_the_gpu_set_holds_its_ocr_engine(reports) -> None:
    missing = [dist for dist in GPU_OCR_ENGINE if dist not in versions(reports["gpu"])]
    assert not missing, f"requirements/gpu.txt resolves without {missing}, its OCR engine (docs/rewards.md)"


def test_the_npu_set_holds_torch_npu_of_torchs_release(reports) -> None:
    torch_version = core_torch().removeprefix("torch==")
    npu_version = versions(reports["npu"]).get("torch-npu")
    assert npu_version is not None, "requirements/npu.txt resolves without torch-npu"
    assert npu_version.split(".")[:2] == torch_version.split(".")[:2], (npu_version, torch_version)


@pytest.mark.parametrize("requirement_set", ["gpu", "npu"])
def test_one_distribution_per_import_package(reports, requirement_set: str) -> None:
    for module, dists in SAME_IMPORT.items():
        present = sorted(dists & set(versions(reports[requirement_set])))
        assert len(present) <= 1, (
            f"requirements/{requirement_set}.txt installs {present}, which all write the import package {module!r}: "
            f"whichever pip writes last replaces the other's files. Keep one (common.txt must not name the CPU build "
            f"that gpu.txt replaces)")
