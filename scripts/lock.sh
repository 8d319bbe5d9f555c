#!/usr/bin/env bash
# Regenerates requirements/cpu.lock, the exact pins with hashes that scripts/env.sh builds .venv from, from
# requirements/core.txt, dev.txt and docs.txt (and the files they include). Run it after changing any of them:
#   bash scripts/lock.sh              # keep every pin the inputs allow, add what they now need
#   bash scripts/lock.sh --upgrade    # re-resolve everything to the newest versions the inputs allow
# It must run where the lock is used: CPython 3.11 on Linux x86_64 (scripts/env.sh's RLRUNNER_LOCK_PLATFORM), with
# pip able to find torch's CPU build for the version core.txt pins (e.g. PIP_EXTRA_INDEX_URL=
# https://download.pytorch.org/whl/cpu), so that torch's requirements are those of that build. torch itself is left
# out of the lock: its build depends on where pip finds it (docs/install.md "The torch build").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
PIP_TOOLS="pip-tools==7.7.0"
platform="$(rlrunner_platform python3)"
if [ "$platform" != "$RLRUNNER_LOCK_PLATFORM" ]; then
    echo "lock.sh: error: python3 is $platform; the lock is compiled on $RLRUNNER_LOCK_PLATFORM" >&2
    exit 2
fi
tools="$(mktemp -d)"
trap 'rm -rf "$tools"' EXIT
python3 -m venv "$tools"
"$tools/bin/python" -m pip install --quiet "$PIP_TOOLS"
cd "$ROOT"
# --unsafe-package torch: torch is left unpinned (a comment), setuptools is pinned like any other package
CUSTOM_COMPILE_COMMAND="bash scripts/lock.sh" "$tools/bin/pip-compile" --quiet --generate-hashes --strip-extras \
    --unsafe-package torch --no-emit-index-url --no-emit-find-links --no-emit-trusted-host \
    --output-file requirements/cpu.lock "$@" requirements/core.txt requirements/dev.txt requirements/docs.txt
if grep -q -E '^(nvidia-(cu|nccl|nvjitlink|nvtx|nvshmem)|triton==)' requirements/cpu.lock; then
    echo "lock.sh: error: torch resolved to a CUDA build (the lock now holds its NVIDIA libraries): let pip find the" \
        "CPU build first, e.g. PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/lock.sh" >&2
    exit 1
fi
echo "lock.sh: requirements/cpu.lock $(python3 scripts/lock_check.py --hash)"
