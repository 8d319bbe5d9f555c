#!/usr/bin/env bash
# Launch a training recipe.
#   bash examples/diffusion/run_diffusion.sh                          # the default recipe (CPU, tiny model)
#   bash examples/diffusion/run_diffusion.sh <config_name> [key=value ...] [--dry-run]
# <config_name> is a file stem in examples/diffusion/config/. Logs go to logs/<YYYYmmdd-HHMMSS>-<config_name>/
# (command line, console log, resolved config, TensorBoard events, metrics, samples, checkpoints).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/env.sh"
CONFIG_DIR="$ROOT/examples/diffusion/config"
DEFAULT_RECIPE="tiny_awm_ocr"

usage() {
    cat <<USAGE
usage: bash examples/diffusion/run_diffusion.sh [<config_name>] [key=value ...] [--dry-run]

Runs the recipe examples/diffusion/config/<config_name>.yaml (default: $DEFAULT_RECIPE) with dotted overrides,
logging to logs/<YYYYmmdd-HHMMSS>-<config_name>/ (or under \$RLRUNNER_LOG_ROOT).
  --dry-run     validate and print the resolved recipe; starts nothing and creates no log folder
  -h, --help    this message

recipes:
USAGE
    for recipe in "$CONFIG_DIR"/*.yaml; do
        printf '  %-32s %s\n' "$(basename "$recipe" .yaml)" "$(sed -n '1s/^# *//p' "$recipe")"
    done
}

for arg in "$@"; do
    case "$arg" in
        -h|--help) usage; exit 0 ;;
    esac
done
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
for arg in "$@"; do
    # a dry run validates and prints; it leaves no log folder behind
    [ "$arg" = "--dry-run" ] && exec "$PY" -m rlrunner.train --config-name "$name" "$@"
done

log_dir="${RLRUNNER_LOG_ROOT:-$ROOT/logs}/$(date +%Y%m%d-%H%M%S)-$name"
mkdir -p "$log_dir"
printf '%q ' bash "examples/diffusion/run_diffusion.sh" "$name" "$@" > "$log_dir/command.txt"
echo >> "$log_dir/command.txt"
echo "rlrunner: logging to $log_dir" >&2
"$PY" -u -m rlrunner.train --config-name "$name" --log-dir "$log_dir" "$@" 2>&1 | tee -a "$log_dir/console.log"
