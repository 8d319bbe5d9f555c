#!/usr/bin/env bash
# Runs the test suite, setting up the Python environment first (see scripts/env.sh).
#   bash scripts/test.sh                 # everything, as CI runs it
#   bash scripts/test.sh -m "not slow"   # skip the end-to-end runs (minutes)
#   bash scripts/test.sh tests/algorithms -x
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
rlrunner_pick_python
cd "$ROOT"
echo "rlrunner: testing with $PY" >&2
exec "$PY" -m pytest -q "$@"
