#!/usr/bin/env bash
# Launch a training recipe.
#   bash examples/diffusion/run_diffusion.sh                          # the default recipe (CPU, tiny model)
#   bash examples/diffusion/run_diffusion.sh <config_name> [key=value ...] [--dry-run]
# <config_name> is a file stem in examples/diffusion/config/. Logs go to logs/<YYYYmmdd-HHMMSS>-<config_name>/
# (command line, console log, resolved config, TensorBoard events, metrics, samples, checkpoints).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/env.sh"
CONFIG_DIR="$ROOT/examples/diffusion/config"
DEFAULT_RECIPE="tiny_nft_ocr"

name="$DEFAULT_RECIPE"
if [ $# -gt 0 ] && [[ "$1" != -* ]] && [[ "$1" != *=* ]]; then
    name="$1"
    shift
fi
rlrunner_pick_python
cd "$ROOT"
if [ ! -f "$CONFIG_DIR/$name.yaml" ]; then
    # Let the entry point print the error with the list of recipes.
    exec "$PY" -m rlrunner.train --config-name "$name" --dry-run
fi

log_dir="${RLRUNNER_LOG_ROOT:-$ROOT/logs}/$(date +%Y%m%d-%H%M%S)-$name"
mkdir -p "$log_dir"
printf '%q ' bash "examples/diffusion/run_diffusion.sh" "$name" "$@" > "$log_dir/command.txt"
echo >> "$log_dir/command.txt"
echo "rlrunner: logging to $log_dir" >&2
"$PY" -u -m rlrunner.train --config-name "$name" --log-dir "$log_dir" "$@" 2>&1 | tee -a "$log_dir/console.log"
