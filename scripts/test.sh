#!/usr/bin/env bash
# Runs the test suite, setting up the Python environment first (see scripts/env.sh).
#   bash scripts/test.sh                 # everything, as CI runs it (about 40 minutes on 2 CPU cores)
#   bash scripts/test.sh -m "not slow"   # skip the end-to-end runs (minutes)
#   bash scripts/test.sh tests/algorithms -x
#   bash scripts/test.sh -n 0 ...        # in this one process (a debugger, -s)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
rlrunner_pick_python test
cd "$ROOT"
echo "rlrunner: testing with $PY" >&2
# the docs site's build test (tests/project/test_docs_site.py) needs mkdocs-material (requirements/docs.txt, in the lock and
# so in .venv); another environment is only told how (the test is skipped there without it)
if ! "$PY" -c "import mkdocs, material" >/dev/null 2>&1; then
    echo "rlrunner: $PY lacks mkdocs-material, so tests/project/test_docs_site.py is skipped; to run it:" \
        "$PY -m pip install -r requirements/docs.txt" >&2
fi
# Two test processes (pytest-xdist): most tests compute on one core or wait on Ray, subprocesses and sockets, so a
# second process keeps both cores busy. Each takes whole files (--dist loadfile: a file's fixtures, e.g. a Ray
# cluster, are built once) in collection order (--no-loadscope-reorder), which puts the longest runs first
# (tests/conftest.py), so that they overlap the rest instead of trailing. Each test process computes on one thread:
# two processes of two OpenMP threads on two cores spin against each other (the runs that tests start size their
# threads from the recipe, cluster.cpus_per_worker). Each file is named as it starts; --durations lists the slowest
# tests.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$PY" -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=15 "$@"
