# Sourced by the launcher and the test script: picks the Python that runs rlrunner and exports it as $PY.
#
# 1. $PYTHON, whenever it is set: used when rlrunner's requirements import there (e.g. a GPU user's own
#    environment with CUDA torch), an error naming what it lacks otherwise. The launcher and bin/rlrunner ask only
#    for what a run imports; scripts/test.sh (`rlrunner_pick_python test`) asks for the test tools too.
# 2. The project-local virtual environment .venv, when it exists: built from the lock (requirements/cpu.lock) on
#    first use and rebuilt to match whenever the lock or a requirements file changes.
# 3. `python3`, when there is no .venv and rlrunner's requirements import there.
# 4. Otherwise a new .venv from the lock.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# Exact pins with hashes of everything but torch, compiled by scripts/lock.sh from the files below for one platform
RLRUNNER_LOCK="$ROOT/requirements/cpu.lock"
RLRUNNER_LOCK_PLATFORM="CPython 3.11 Linux x86_64"
# What the lock was compiled from: installed after it to add torch, pinned by version only (its build depends on
# where pip finds it: docs/install.md "The torch build"); everything else is already there at the lock's pins
RLRUNNER_REQS=("$ROOT/requirements/core.txt" "$ROOT/requirements/dev.txt" "$ROOT/requirements/docs.txt")
RLRUNNER_REQ_FILES=("$RLRUNNER_LOCK" "${RLRUNNER_REQS[@]}" "$ROOT/requirements/common.txt"
                    "$ROOT/requirements/loggers.txt")
# Modules a run imports; an OCR engine is either RapidOCR (every requirement set) or PaddleOCR (installed by hand).
RLRUNNER_PROBE='import torch, diffusers, peft, transformers, omegaconf, ray, tensorboard, PIL, imageio, Levenshtein
try:
    import rapidocr
except ImportError:
    import paddleocr'
# ... and what the test suite adds (requirements/dev.txt): only scripts/test.sh needs them
RLRUNNER_TEST_PROBE="$RLRUNNER_PROBE
import pytest, xdist, hypothesis"

# rlrunner_env_ok PYTHON [run|test]: whether PYTHON imports what a run (default) or the test suite needs
rlrunner_env_ok() {
    local probe="$RLRUNNER_PROBE"
    [ "${2:-run}" = test ] && probe="$RLRUNNER_TEST_PROBE"
    "$1" -c "$probe" >/dev/null 2>&1
}

# rlrunner_env_lacks PYTHON [run|test]: the import error that makes rlrunner_env_ok fail, as one line
rlrunner_env_lacks() {
    local probe="$RLRUNNER_PROBE"
    [ "${2:-run}" = test ] && probe="$RLRUNNER_TEST_PROBE"
    "$1" -c "$probe" 2>&1 >/dev/null | tail -n 1
}

# rlrunner_platform PYTHON: "CPython 3.11 Linux x86_64", comparable with RLRUNNER_LOCK_PLATFORM
rlrunner_platform() {
    "$1" -c 'import platform, sys; print(platform.python_implementation(), "%d.%d" % sys.version_info[:2],
          platform.system(), platform.machine())'
}

# rlrunner_pick_python [run|test]: sets $PY (see the top of this file)
rlrunner_pick_python() {
    local purpose="${1:-run}" venv="$ROOT/.venv" stamp
    if [ -n "${PYTHON:-}" ]; then
        if ! command -v "$PYTHON" >/dev/null; then
            echo "rlrunner: error: PYTHON=$PYTHON is not a python on this machine; set it to one, or unset it to" \
                "use $venv" >&2
            return 2
        fi
        if ! rlrunner_env_ok "$PYTHON" "$purpose"; then
            local wanted="requirements/gpu.txt (a CUDA machine) or requirements/core.txt"
            [ "$purpose" = test ] && rlrunner_env_ok "$PYTHON" run && wanted="requirements/dev.txt (the test tools)"
            echo "rlrunner: error: PYTHON=$PYTHON lacks rlrunner's requirements ($(rlrunner_env_lacks "$PYTHON" "$purpose"));" \
                "install $wanted there ($PYTHON -m pip install -r ...), or unset PYTHON to use $venv" >&2
            return 2
        fi
        PY="$(command -v "$PYTHON")"
        return 0
    fi
    stamp="$(cat "${RLRUNNER_REQ_FILES[@]}" | sha256sum | cut -c1-16)"
    if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.requirements-stamp" 2>/dev/null)" = "$stamp" ]; then
        PY="$venv/bin/python"
        return 0
    fi
    if [ ! -x "$venv/bin/python" ] && rlrunner_env_ok python3 "$purpose"; then
        PY="$(command -v python3)"
        return 0
    fi
    if [ ! -x "$venv/bin/python" ] && [ "$purpose" = test ] && rlrunner_env_ok python3 run; then
        echo "rlrunner: python3 runs rlrunner but lacks the test tools (pytest, pytest-xdist, hypothesis); to test in it" \
            "instead of a new .venv: python3 -m pip install -r requirements/dev.txt" >&2
    fi
    rlrunner_build_venv "$venv" "$stamp" || return 1
    PY="$venv/bin/python"
}

# rlrunner_build_venv VENV STAMP: VENV made (or brought back) to the lock, torch added at its pinned version
rlrunner_build_venv() {
    local venv="$1" stamp="$2" platform
    if [ -x "$venv/bin/python" ]; then
        echo "rlrunner: the lock or a requirements file changed; bringing $venv to requirements/cpu.lock" >&2
    else
        echo "rlrunner: creating $venv from requirements/cpu.lock (first run only: a few minutes; 2.6 GB with the CPU" \
            "torch build, about 6.2 GB with a CUDA one: docs/install.md)" >&2
        python3 -m venv "$venv" || { echo "rlrunner: could not create $venv (is python3-venv installed?)" >&2; return 1; }
    fi
    "$venv/bin/python" -m pip install --quiet --upgrade pip >&2 ||
        { echo "rlrunner: could not upgrade pip in $venv (see above)" >&2; return 1; }
    platform="$(rlrunner_platform "$venv/bin/python")"
    # pip's own lines, one step at a time: minutes of silence would look like a hang
    if [ "$platform" = "$RLRUNNER_LOCK_PLATFORM" ]; then
        echo "rlrunner: [1/2] pip install --require-hashes --no-deps -r requirements/cpu.lock into $venv" >&2
        "$venv/bin/python" -m pip install --progress-bar on --require-hashes --no-deps -r "$RLRUNNER_LOCK" >&2 ||
            { echo "rlrunner: pip install -r $RLRUNNER_LOCK into $venv failed (see above)" >&2; return 1; }
        echo "rlrunner: [2/2] pip install torch (pinned in requirements/core.txt) into $venv" >&2
    else
        echo "rlrunner: warning: the lock is for $RLRUNNER_LOCK_PLATFORM and $venv is $platform: installing the" \
            "unlocked requirements instead, so figures in the docs may not reproduce here (docs/install.md)" >&2
    fi
    "$venv/bin/python" -m pip install --progress-bar on "${RLRUNNER_REQS[@]/#/-r}" >&2 ||
        { echo "rlrunner: pip install -r ${RLRUNNER_REQS[*]#"$ROOT"/} into $venv failed (see above)" >&2; return 1; }
    if [ "$platform" = "$RLRUNNER_LOCK_PLATFORM" ]; then
        # what the environment holds beyond the lock and torch's own requirements (an earlier lock's packages)
        "$venv/bin/python" "$ROOT/scripts/lock_check.py" --lock "$RLRUNNER_LOCK" --remove-extras >&2 ||
            { echo "rlrunner: $venv does not match $RLRUNNER_LOCK (see above)" >&2; return 1; }
    fi
    echo "$stamp" > "$venv/.requirements-stamp"
}
