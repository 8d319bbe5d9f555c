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


#: a benchmark's run in seconds, on what it reads without training (config-only model folders): it keeps working
#: through refactors of what it calls (bench/data_plane.py crashed when step_geometry gained its guidance argument)
QUICK_RUNS = {"data_plane.py": (["--recipe", "sd3_nft_ocr"], "8 ranks: a rank's bytes")}


@pytest.mark.parametrize("script", sorted(QUICK_RUNS))
def test_bench_script_runs_quickly(script, tmp_path):
    args, printed = QUICK_RUNS[script]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert printed in result.stdout
