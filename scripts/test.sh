#!/usr/bin/env bash
# Runs the test suite, setting up the Python environment first (see scripts/env.sh).
#   bash scripts/test.sh                 # everything, as CI runs it (about 37 minutes on 2 CPU cores)
#   bash scripts/test.sh -m "not slow"   # skip the end-to-end runs (minutes)
#   bash scripts/test.sh tests/algorithms -x
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
rlrunner_pick_python test
cd "$ROOT"
echo "rlrunner: testing with $PY" >&2
# Not -q: pytest's default output names each test file before its dots (about 60 lines), so a file that runs
# for minutes shows which one it is; -v would be a line per test (hundreds). --durations lists the slowest tests.
exec "$PY" -m pytest --durations=15 "$@"
