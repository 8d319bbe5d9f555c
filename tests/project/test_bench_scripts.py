"""Every benchmark runs as its docstring says from the project's virtual environment: here, its ``--help``; and the
benchmarks that run in seconds run (QUICK_RUNS)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "bench").iterdir() if p.suffix in (".py", ".sh"))
#: Runs each Python script given as ``script --help`` in a fork of one process that has imported the libraries
#: (not rlrunner, not the benches' own modules), so that each still finds rlrunner as a fresh
#: ``.venv/bin/python bench/x.py`` does, from its own sys.path, but no script pays for torch's import again.
#: Prints one JSON line per script: its exit status and output.
HELP_EACH = r"""
import importlib, json, os, runpy, sys, tempfile
for library in ("torch", "numpy", "PIL", "omegaconf", "diffusers", "transformers", "peft", "ray"):
    try:
        importlib.import_module(library)
    except ImportError:
        pass
for script in sys.argv[1:]:
    with tempfile.TemporaryFile() as out:
        pid = os.fork()
        if pid == 0:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            sys.argv = [script, "--help"]
            code = 0
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        print(json.dumps({"script": script, "code": os.waitstatus_to_exitcode(status),
                          "output": out.read().decode(errors="replace")}), flush=True)
"""


def _environment(tmp_path: Path) -> dict[str, str]:
    # from another directory and without PYTHONPATH, as a fresh clone's `.venv/bin/python bench/x.py` runs it
    return {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)}


@pytest.fixture(scope="module")
def python_helps(tmp_path_factory) -> dict[str, dict]:
    cwd = tmp_path_factory.mktemp("bench-help")
    scripts = [str(p) for p in SCRIPTS if p.suffix == ".py"]
    done = subprocess.run([sys.executable, "-c", HELP_EACH, *scripts], cwd=cwd, env=_environment(cwd),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines()]
    return {Path(r["script"]).name: r for r in results}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_script_help_runs_from_a_checkout(script, tmp_path, request):
    if script.suffix == ".sh":
        result = subprocess.run(["bash", str(script), "--help"], cwd=tmp_path, env=_environment(tmp_path),
                                capture_output=True, text=True, timeout=120, check=False)
        code, output = result.returncode, result.stdout + result.stderr
    else:
        help_of = request.getfixturevalue("python_helps")[script.name]
        code, output = help_of["code"], help_of["output"]
    assert code == 0, output[-2000:]
    assert "usage:" in output


def test_the_help_check_sees_a_script_that_needs_rlrunner_on_its_path(tmp_path):
    """A bench script that imports rlrunner without putting the checkout on its path fails there, even after a
    script that did."""
    good = tmp_path / "good.py"
    good.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport rlrunner\nprint('usage: good')\n")
    bad = tmp_path / "bad.py"
    bad.write_text("import rlrunner\nprint('usage: bad')\n")
    done = subprocess.run([sys.executable, "-c", HELP_EACH, str(good), str(bad)], cwd=tmp_path,
                          env=_environment(tmp_path), capture_output=True, text=True, timeout=120, check=False)
    codes = {Path(r["script"]).name: r["code"] for r in map(json.loads, done.stdout.splitlines())}
    assert codes == {"good.py": 0, "bad.py": 1}, done.stdout[-2000:]


#: each benchmark's quick run (``--quick``: its own code path at tiny sizes; data_plane.py reads config-only model
#: folders and trains nothing), so that it keeps working through refactors of what it calls (bench/data_plane.py
#: crashed when step_geometry gained its guidance argument, bench/data_plane_measured.py when the runner's sample
#: logging moved): the arguments, and a line its full run prints too, once the work is done
QUICK_RUNS = {
    "data_plane.py": (["--recipe", "sd3_nft_ocr"], "8 ranks: a rank's bytes"),
    "nft_step.py": (["--quick"], "switch to ema and back, AdapterSwitch"),
    "rollout_overhead.py": (["--quick"], "worst ratio "),
    "tiny_headroom.py": (["--quick"], "step 1: held-out reward"),
    "ocr_throughput.py": (["--quick"], "128x32      processes"),
    "reward_service.py": (["--quick"], "  True"),
    "context_parallel.py": (["--quick"], "cp 2 / cp 1 per rank: activations"),
    "step_breakdown.py": (["--quick"], "async_reward=false: step/(rollout+train) ="),
    "cpu_recipe.py": (["--quick"], "held-out reward gained per minute"),
    # these start a Ray cluster of three workers (and recovery.py restarts it): a minute or two each
    "data_plane_measured.py": (["--quick"], "conditioning to the actor:"),
    "actor_ranks.py": (["--quick"], "engine overhead, CPU = (2 ranks - 2 ranks no engine) / 1 rank ="),
    "recovery.py": (["--quick"], "(median before the kill)"),
}
#: quick runs of more than a few seconds: torch's import, an OCR engine, a server or a Ray cluster started
SLOW_QUICK_RUNS = set(QUICK_RUNS) - {"data_plane.py"}


@pytest.mark.parametrize("script", [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW_QUICK_RUNS else [])
                                    for name in sorted(QUICK_RUNS)])
def test_bench_script_runs_quickly(script, tmp_path):
    args, printed = QUICK_RUNS[script]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=420, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert printed in result.stdout


#: the scripts without a quick run here, and what runs them instead
RUN_ELSEWHERE = {
    "algorithms.py": "tests/project/test_bench_algorithms.py (its report and step-budget calibration)",
    "simulate_recipes.py": "full-size simulations, minutes a recipe; tests/sizing/test_plan_vs_simulation.py runs its "
                           "fit table and plan --simulate",
    "compat.sh": "builds environments of other torch versions (minutes, the index); it runs test files of this suite",
    "provenance.py": "a module the other scripts import",
    **{name: "the GPU check, rehearsed on CPU with --tiny by tests/project/test_gpu_check*.py"
       for name in ("gpu_check.sh", "gpu_check.py", "gpu_parts.py", "gpu_launched.py", "gpu_prepare.py",
                    "gpu_folders.py")},
}


def test_every_bench_script_has_a_quick_run_or_says_what_runs_it():
    assert sorted(p.name for p in SCRIPTS) == sorted({*QUICK_RUNS, *RUN_ELSEWHERE})
