#!/usr/bin/env bash
# The compatibility check: a smoke subset of the tests under the oldest versions pyproject.toml's [project] ranges
# admit, in a throwaway virtual environment. Run by hand, not by the test suite nor CI, so it is outside the suite's
# time budget: on first use 3.1 GB downloaded (torch 2.11 with its CUDA libraries 2.6 GB, the rest of the lock 0.5 GB)
# and a 6.2 GB venv built in about 6 minutes; then about 3 minutes of tests on 2 CPU cores.
#
#   bash bench/compat.sh                     # build the venv (first use only), run the smoke subset, print the result
#   bash bench/compat.sh --diffusers 0.41.0  # another version of one package (also --torch, --transformers, --hub)
#   bash bench/compat.sh --venv DIR --rm     # the venv's folder (default bench_runs/compat/venv); --rm: delete it
#   bash bench/compat.sh --help
#
# The venv: torch 2.11.0 (the GPU machine's; PyPI's CUDA build, which runs on the CPU), transformers 5.17.0 and
# huggingface-hub 1.33.0 (the GPU machine's), the oldest diffusers supported, setuptools 81.0.0 (torch 2.11 asks for
# < 82); every other package at requirements/cpu.lock's pins, installed from the lock with its hashes; `pip check`
# must pass and no other package may differ from the lock. The smoke subset (SMOKE below, one process):
#   DDP built under torch 2.11's constructor on 2 gloo ranks     tests/distributed/test_ddp_versions.py
#   one run of each algorithm on the tiny model, in-process      nft (test_runner.py), awm, flow_grpo
#   every family's actor on 2 gloo ranks, with DDP and FSDP2      tests/models/test_family_parallel.py
#   every family's Euler rollout against its diffusers pipeline   tests/models/test_model_families.py -k pipeline
#   Ulysses context parallelism on 2 gloo ranks (FLUX.1)          tests/distributed/test_context_parallel.py
# Prints the versions, the tests' summary and the times, and writes them to bench_runs/compat/compat-<time>.txt; exits
# 1 if the venv cannot be built or a test fails. The last run is in docs/install.md "Supported versions".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCK="$ROOT/requirements/cpu.lock"

TORCH=2.11.0
TRANSFORMERS=5.17.0
HUB=1.33.0
DIFFUSERS=0.40.0
SETUPTOOLS=81.0.0  # torch 2.11 requires setuptools<82; the lock pins a newer one
VENV="$ROOT/bench_runs/compat/venv"
REMOVE=0
SMOKE=(
    tests/distributed/test_ddp_versions.py
    tests/run/test_runner.py::test_local_run_logs_every_metric_to_tensorboard_and_jsonl
    tests/run/test_runner_awm.py::test_awm_samples_with_the_trained_adapter_and_anchors_to_base_and_ema
    tests/algorithms/test_flow_grpo_loss.py::test_one_runner_step_of_flow_grpo_and_its_fast_window
    tests/models/test_family_parallel.py
    "tests/distributed/test_context_parallel.py::test_cp2_on_two_ranks_trains_and_samples_as_one_device[flux1]"
    "tests/models/test_model_families.py -k pipeline"
)

usage() {
    cat <<EOF
usage: bash bench/compat.sh [--torch V] [--transformers V] [--hub V] [--diffusers V] [--venv DIR] [--rm]

Builds a venv with the oldest supported versions (the rest at requirements/cpu.lock's pins) and runs the smoke subset.

options:
  --torch V          torch version (default $TORCH)
  --transformers V   transformers version (default $TRANSFORMERS)
  --hub V            huggingface-hub version (default $HUB)
  --diffusers V      diffusers version (default $DIFFUSERS)
  --venv DIR         the venv's folder, reused when it exists (default bench_runs/compat/venv)
  --rm               delete the venv at the end
  -h, --help         show this help and exit
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
        --torch) TORCH="$2"; shift 2 ;;
        --transformers) TRANSFORMERS="$2"; shift 2 ;;
        --hub) HUB="$2"; shift 2 ;;
        --diffusers) DIFFUSERS="$2"; shift 2 ;;
        --venv) VENV="$(mkdir -p "$2" && cd "$2" && pwd)"; shift 2 ;;
        --rm) REMOVE=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "compat.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done

OVERRIDES=("torch==$TORCH" "transformers==$TRANSFORMERS" "huggingface-hub==$HUB" "diffusers==$DIFFUSERS"
           "setuptools==$SETUPTOOLS")
OUT="$ROOT/bench_runs/compat"
mkdir -p "$OUT"
stamp="$(date -u +%Y%m%d-%H%M%S)"
report="$OUT/compat-$stamp.txt"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$ROOT"

# 1. the venv: the lock without the overridden packages (--no-deps, hashes checked), then the overrides with what
#    they need beyond the lock (torch's CUDA libraries)
start=$(date +%s)
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
names=("${OVERRIDES[@]%%==*}")
python3 - "$LOCK" "${names[@]}" >"$work/lock.txt" <<'EOF'
import re
import sys

lock, names = sys.argv[1], {n.lower() for n in sys.argv[2:]}
keep = True
for line in open(lock):
    if line[:1].isalnum():  # an entry starts: name==version \
        keep = re.split(r"[=\[ ;]", line, maxsplit=1)[0].lower() not in names
    if keep:
        sys.stdout.write(line)
EOF
echo "compat: [1/3] the lock (less ${names[*]}) into $VENV" >&2
"$PY" -m pip install --quiet --no-deps --require-hashes -r "$work/lock.txt"
echo "compat: [2/3] ${OVERRIDES[*]}" >&2
"$PY" -m pip install --quiet "${OVERRIDES[@]}"
"$PY" -m pip check
# every package of the lock but the overridden ones at the lock's version
"$PY" - "$LOCK" "${names[@]}" <<'EOF'
import importlib.metadata as md
import re
import sys

lock, names = sys.argv[1], {n.lower() for n in sys.argv[2:]}
pins = re.findall(r"^([A-Za-z0-9][\w.-]*)==(\S+)", open(lock).read(), flags=re.M)
kept = [(n, v) for n, v in pins if n.lower() not in names]
moved = [f"{n} {md.version(n)} (lock {v})" for n, v in kept if md.version(n) != v]
if moved:
    sys.exit(f"compat: packages that differ from the lock: {', '.join(moved)}")
print(f"compat: {len(kept)} of the lock's {len(pins)} packages at its pins, the others overridden", file=sys.stderr)
EOF
built=$(( $(date +%s) - start ))

# 2. the smoke subset, in one process
echo "compat: [3/3] the smoke subset" >&2
start=$(date +%s)
status=0
# -k applies to every path given, so the families' pipeline tests run as their own pytest call
paths=() ; selected=()
for item in "${SMOKE[@]}"; do
    case "$item" in *" -k "*) selected+=("$item") ;; *) paths+=("$item") ;; esac
done
summary=()
run_pytest() {
    local log="$work/pytest${#summary[@]}.log"
    "$PY" -m pytest -p no:xdist -p no:cacheprovider -q -rfE --durations=5 "$@" 2>&1 | tee "$log" >&2 || status=1
    summary+=("$(tail -n 1 "$log" | tr -d '=' | sed 's/^ *//; s/ *$//')")
}
run_pytest "${paths[@]}"
for item in "${selected[@]}"; do read -ra words <<<"$item"; run_pytest "${words[@]}"; done
tested=$(( $(date +%s) - start ))

versions="$("$PY" - <<'EOF'
import importlib.metadata as md
import platform

import torch

names = ["torch", "transformers", "huggingface-hub", "diffusers", "peft", "accelerate", "tokenizers", "ray", "numpy"]
build = "CUDA " + torch.version.cuda if torch.version.cuda else "CPU"
print(f"Python {platform.python_version()}; " + ", ".join(f"{n} {md.version(n)}" for n in names)
      + f" (torch's build: {build}, run on the CPU)")
EOF
)"
lock_hash="$(python3 scripts/lock_check.py --hash 2>/dev/null || sha256sum "$LOCK" | cut -c1-12)"
{
    echo "bench/compat.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), lock $lock_hash, $(nproc) CPU cores"
    echo "versions: $versions"
    echo "venv: $VENV, $(du -sh "$VENV" | cut -f1), installed in ${built} s"
    echo "tests (the ${#paths[@]} paths of SMOKE): ${summary[0]}"
    for i in "${!selected[@]}"; do echo "tests (${selected[$i]}): ${summary[$((i + 1))]}"; done
    echo "smoke subset: $([ "$status" = 0 ] && echo passed || echo FAILED) in ${tested} s"
} | tee "$report"
echo "compat: written to ${report#"$ROOT"/}" >&2
[ "$REMOVE" = 0 ] || rm -rf "$VENV"
exit "$status"
