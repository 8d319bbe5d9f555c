#!/usr/bin/env bash
# The device check: rlrunner's GPU path measured and run on random-weight models, nothing downloaded.
#
#   bash bench/gpu_check.sh --prepare .gpu_check          # here, with the registry: wheels + simulations (<= 40 MiB)
#   bash bench/gpu_check.sh --offline .gpu_check --out DIR  # on a GPU without network (the lent one): installs the
#                                                         # prepared wheels into a temporary folder, runs the check
#   bash bench/gpu_check.sh --out DIR                     # a GPU whose Python has rlrunner's requirements (rented)
#   bash bench/gpu_check.sh --tiny --out DIR              # the same code on CPU with tiny folders (CI)
#   bash bench/gpu_check.sh --help                        # every option (--prepare DIR --help: those of preparing)
#
# Parts (bench/gpu_check.py says more): ddp, fsdp2 (sd3_nft_ocr's step, phase by phase, in one process), wan
# (wan22_ti2v_5b_nft_video_ocr's); with --parts also runner, qwen (recipes through the launcher). Results: the table
# and JSON in DIR, rewritten after every part; exit status 1 if a part failed. The Python: $PYTHON, else .venv's,
# else python3 (the lent GPU's own, with its torch).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
cd "$ROOT"
if [ "${1:-}" = "--prepare" ]; then
    exec "$PY" "$ROOT/bench/gpu_prepare.py" "$@"
fi
args=()
offline=""
while [ $# -gt 0 ]; do
    case "$1" in
        --offline)
            if [ $# -lt 2 ]; then
                echo "gpu_check: --offline needs the prepared folder (bash bench/gpu_check.sh --prepare DIR)" >&2
                exit 2
            fi
            offline="$2"; args+=(--prepared "$2"); shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
if [ -n "$offline" ]; then
    if ! ls "$offline"/wheels/*.whl >/dev/null 2>&1; then
        echo "gpu_check: $offline/wheels/ holds no wheels: bash bench/gpu_check.sh --prepare $offline makes them" >&2
        exit 2
    fi
    site="$(mktemp -d "${TMPDIR:-/tmp}/rlrunner-gpu-site.XXXXXX")"
    trap 'rm -rf "$site"' EXIT
    # the prepared wheels only: no index, no configured find-links, none of their requirements (the image has them)
    env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null \
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
        --target "$site" "$offline"/wheels/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    # the model folders are local: no library should try the hub on a machine where every connection fails
    export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
fi
"$PY" "$ROOT/bench/gpu_check.py" "${args[@]}"
