#!/usr/bin/env bash
# Launch a training recipe: bin/rlrunner train calls this (and so may bash examples/diffusion/run_diffusion.sh).
#   bin/rlrunner train                                               # the default recipe (CPU, tiny model)
#   bin/rlrunner train <config_name> [key=value ...] [--dry-run]
# <config_name> is a file stem in examples/diffusion/config/, or a recipe's .yaml path. Logs go to logs/<YYYYmmdd-HHMMSS>-<config_name>/
# (command line, console log, resolved config, TensorBoard events, metrics, samples, checkpoints).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/env.sh"
CONFIG_DIR="$ROOT/examples/diffusion/config"
DEFAULT_RECIPE="tiny_awm_ocr"

usage() {
    cat <<USAGE
usage: bin/rlrunner train [<config_name> | --config-name <config_name>] [key=value ...] [--dry-run]

Runs the recipe examples/diffusion/config/<config_name>.yaml (default: $DEFAULT_RECIPE; or give a recipe's
.yaml path, e.g. an RLinf recipe in its own config folder) with dotted overrides (hydra's +key=value and
++key=value work too), logging to logs/<YYYYmmdd-HHMMSS>-<config_name>/ (or under \$RLRUNNER_LOG_ROOT).
bash examples/diffusion/run_diffusion.sh ... is the same. Every key: bin/rlrunner keys [prefix].
  --dry-run     (anywhere on the line) validate and print the resolved recipe; starts nothing, creates no log folder
  -h, --help    this message

recipes:
USAGE
    for recipe in "$CONFIG_DIR"/*.yaml; do
        # the recipe's description: its leading comment up to the first blank comment line or example command line
        # (indented lines that are not commands, a list or a sentence's continuation, belong to it)
        printf '  %s\n' "$(basename "$recipe" .yaml)"
        awk '!/^#/ || /^# *$/ || /^#   +(bash|bin\/rlrunner) / {exit} {sub(/^# ?/, ""); print "      " $0}' "$recipe"
    done
}

# The exact command line, for the run's command.txt (bin/rlrunner train passes its own).
command_line="${RLRUNNER_COMMAND_LINE:-$(printf '%q ' bash "$0" "$@")}"
unset RLRUNNER_COMMAND_LINE
dry_run=()
args=()
for arg in "$@"; do
    case "$arg" in
        -h|--help) usage; exit 0 ;;
        --dry-run) dry_run=(--dry-run) ;;
        *) args+=("$arg") ;;
    esac
done
name="$DEFAULT_RECIPE"
if [ ${#args[@]} -gt 0 ] && [[ "${args[0]}" != -* ]] && [[ "${args[0]}" != *=* ]]; then
    name="${args[0]}"
    args=("${args[@]:1}")
fi
# --config-name NAME (the entry point's spelling) names the recipe too, so that the run folder is named after it
rest=()
while [ ${#args[@]} -gt 0 ]; do
    case "${args[0]}" in
        --config-name=*) name="${args[0]#--config-name=}"; args=("${args[@]:1}") ;;
        --config-name)
            if [ ${#args[@]} -lt 2 ]; then
                echo "rlrunner: error: --config-name needs a recipe name; bin/rlrunner train --help lists them" >&2
                exit 2
            fi
            name="${args[1]}"; args=("${args[@]:2}") ;;
        *) rest+=("${args[0]}"); args=("${args[@]:1}") ;;
    esac
done
args=("${rest[@]}")
if [[ "$name" == *.yaml ]] && [ -f "$name" ]; then
    # a recipe file of one's own (e.g. an RLinf config folder): its defaults list composes from its folder
    name="$(cd "$(dirname "$name")" && pwd)/$(basename "$name")"
fi
rlrunner_pick_python
export RLRUNNER_CALLER_CWD="$PWD"  # where the user's shell is: the closing summary prints commands that work there
cd "$ROOT"
log_dir="${RLRUNNER_LOG_ROOT:-$ROOT/logs}/$(date +%Y%m%d-%H%M%S)-$(basename "$name" .yaml)"
if [ ${#dry_run[@]} -gt 0 ] || { [ ! -f "$CONFIG_DIR/$name.yaml" ] && [ ! -f "$name" ]; }; then
    # a dry run validates and prints (and names the folder a run would log to), leaving no log folder behind; an
    # unknown name gets the list of recipes
    exec "$PY" -m rlrunner.commands.train --config-name "$name" --log-dir "$log_dir" --dry-run "${args[@]}"
fi
# The run writes its own console.log (the progress bar keeps the terminal) and creates the log folder only once
# the recipe is valid.
exec "$PY" -u -m rlrunner.commands.train --config-name "$name" --log-dir "$log_dir" \
    --command-line "${command_line% }" "${args[@]}"
