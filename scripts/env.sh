# Sourced by the launcher and the test script: picks the Python that runs rlrunner and exports it as $PY.
#
# 1. The current environment (`python3`, or $PYTHON) when rlrunner's requirements import there, e.g. a GPU
#    user's own environment with CUDA torch and PaddleOCR. The launcher and bin/rlrunner ask only for what a run
#    imports; scripts/test.sh (`rlrunner_pick_python test`) asks for pytest too.
# 2. Otherwise the project-local virtual environment .venv, created from requirements/ on first use and
#    brought up to date whenever a requirements file changes.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
RLRUNNER_REQS=("$ROOT/requirements/core.txt" "$ROOT/requirements/dev.txt")
RLRUNNER_REQ_FILES=("$ROOT/requirements/core.txt" "$ROOT/requirements/common.txt" "$ROOT/requirements/dev.txt"
                    "$ROOT/requirements/loggers.txt")
# Modules a run imports; an OCR engine is either RapidOCR (CPU) or PaddleOCR (GPU).
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

# rlrunner_pick_python [run|test]: sets $PY (see the top of this file)
rlrunner_pick_python() {
    local purpose="${1:-run}" candidate="${PYTHON:-python3}" venv="$ROOT/.venv" stamp
    stamp="$(cat "${RLRUNNER_REQ_FILES[@]}" | sha256sum | cut -c1-16)"
    if [ ! -x "$venv/bin/python" ] && command -v "$candidate" >/dev/null; then
        if rlrunner_env_ok "$candidate" "$purpose"; then
            PY="$(command -v "$candidate")"
            return 0
        fi
        if [ "$purpose" = test ] && rlrunner_env_ok "$candidate" run; then
            echo "rlrunner: $candidate runs rlrunner but lacks the test tools (pytest, pytest-xdist, hypothesis); to test in it" \
                "instead of a new .venv: $candidate -m pip install -r requirements/dev.txt" >&2
        fi
    fi
    if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.requirements-stamp" 2>/dev/null)" = "$stamp" ]; then
        PY="$venv/bin/python"
        return 0
    fi
    if [ -x "$venv/bin/python" ]; then
        echo "rlrunner: requirements changed; updating $venv" >&2
    else
        echo "rlrunner: $candidate lacks rlrunner's requirements; creating $venv from requirements/ (first run only: a few minutes; 2.1 GB with the CPU torch build, about 6.2 GB with a CUDA one: docs/install.md)" >&2
        python3 -m venv "$venv" || { echo "rlrunner: could not create $venv (is python3-venv installed?)" >&2; return 1; }
    fi
    "$venv/bin/python" -m pip install --quiet --upgrade pip >&2 ||
        { echo "rlrunner: could not upgrade pip in $venv (see above)" >&2; return 1; }
    # one requirement set at a time, with pip's own lines: minutes of silence would look like a hang
    local i=0 req
    for req in "${RLRUNNER_REQS[@]}"; do
        i=$((i + 1))
        echo "rlrunner: [$i/${#RLRUNNER_REQS[@]}] pip install -r ${req#"$ROOT"/} into $venv" >&2
        "$venv/bin/python" -m pip install --progress-bar on -r "$req" >&2 ||
            { echo "rlrunner: pip install -r $req into $venv failed (see above)" >&2; return 1; }
    done
    echo "$stamp" > "$venv/.requirements-stamp"
    PY="$venv/bin/python"
}
