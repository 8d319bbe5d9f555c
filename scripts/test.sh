#!/usr/bin/env bash
# Runs the test suite, setting up the Python environment first (see scripts/env.sh).
#   bash scripts/test.sh                 # everything, as CI runs it (about 25 minutes on 2 CPU cores)
#   bash scripts/test.sh -m "not slow"   # skip the end-to-end runs (minutes)
#   bash scripts/test.sh tests/algorithms -x
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
rlrunner_pick_python test
cd "$ROOT"
echo "rlrunner: testing with $PY" >&2
# Two test processes (pytest-xdist; `-n 0` runs the tests in this one): many tests wait on Ray, subprocesses and
# sockets, and a second process keeps both cores busy meanwhile. --dist loadgroup sends the tests that start Ray
# clusters to one process, one cluster at a time, and each other test to whichever process is free; the end-to-end
# runs go first (tests/conftest.py), so that the longest overlap the rest. Each test process computes on one
# thread: two processes of two OpenMP threads on two cores spin against each other (the runs that tests start
# size their threads from the recipe, cluster.cpus_per_worker). --durations lists the slowest tests.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$PY" -m pytest -n 2 --dist loadgroup --durations=15 "$@"
