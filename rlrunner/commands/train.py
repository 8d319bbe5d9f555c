"""Command-line entry point of ``bin/rlrunner train [--config-name] NAME [key=value ...] [--dry-run]``.

``examples/diffusion/run_diffusion.sh`` (what ``bin/rlrunner train`` runs) calls this with ``--log-dir``; used
directly (``python -m rlrunner.commands.train``), it makes
``logs/<YYYYmmdd-HHMMSS>-<config_name>/`` itself, once the recipe is valid. Either way the run copies its console
to ``console.log`` from inside (the terminal keeps the progress bar, the log gets plain lines). User errors print
one line and exit with status 2; a worker that raised, died or hung ends the run with status 1 and a last line
naming its component and rank (a node that lacks rlrunner or a recipe folder is a user error: status 2, one line
naming the node and the fix), once ``runner.max_restarts`` restarts on new workers did not help. SIGTERM or SIGINT
(``runner.save_on_signal``) stops the run after its current step with a checkpoint: status 4 (also when the workers
got the signal too and the step in flight died with them); a second signal stops it at once: status 130. The
reward-hacking watch's alarm with ``runner.watch.action: stop`` ends the run with a checkpoint: status 5. Every
status and last line comes from :mod:`rlrunner.run.outcome`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlrunner.algorithms.ema import EMA_KEYS
from rlrunner.config.loader import DEFAULT_RECIPE, RecipeError, to_yaml, with_log_dir
from rlrunner.models import MODEL_FAMILIES, model_class
from rlrunner.objectives import OBJECTIVES
from rlrunner.recipe import load_recipe
from rlrunner.run.outcome import (  # noqa: F401 (the exit statuses, named where the launcher's callers look)
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    EXIT_REWARD_UNAVAILABLE,
    EXIT_USER_ERROR,
    EXIT_WATCH_STOPPED,
    EXIT_WORKER_FAILED,
    run_outcome,
)
from rlrunner.tracking.console import console_copied_to


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bin/rlrunner train",
        description="Run an rlrunner recipe (examples/diffusion/config/<name>.yaml) with dotted key=value overrides.",
    )
    parser.add_argument("--config-name", default=DEFAULT_RECIPE, help="recipe file stem or path to a .yaml")
    parser.add_argument("--log-dir", default="", help="run directory (default: logs/<timestamp>-<config_name>)")
    parser.add_argument("--dry-run", action="store_true", help="validate and print the resolved recipe; start nothing")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.optim.lr=1e-4")
    # the launcher's command line as the user typed it, for the run's command.txt
    parser.add_argument("--command-line", default="", help=argparse.SUPPRESS)
    # --dry-run may stand anywhere, also between overrides
    return parser.parse_intermixed_args(argv)


def default_log_dir(cfg_log_path: str, config_name: str) -> Path:
    # $RLRUNNER_LOG_ROOT first, as run_diffusion.sh: runner.resume_dir=auto searches beside the run's folder
    root = os.environ.get("RLRUNNER_LOG_ROOT") or cfg_log_path
    return Path(root) / f"{time.strftime('%Y%m%d-%H%M%S')}-{Path(config_name).stem}"


def dry_run_view(cfg: DictConfig) -> DictConfig:
    """The resolved recipe without the blocks it does not use: other model families' sections and their own settings
    (:attr:`~rlrunner.models.FlowModel.own_settings`), other algorithms' keys (``algorithm.<name>_*``; the EMA's keys,
    :data:`~rlrunner.algorithms.ema.EMA_KEYS`, serve every algorithm) and unset reward settings."""
    view = OmegaConf.to_container(cfg, resolve=True)
    model = view["actor"]["model"]
    for family in MODEL_FAMILIES:
        if family != model["model_type"]:
            model.pop(family, None)
    others = {key for family in MODEL_FAMILIES for key in model_class(family).own_settings}
    for key in others - set(model_class(model["model_type"]).own_settings):
        model[model["model_type"]].pop(key, None)
    algorithm = view["algorithm"]
    for name in OBJECTIVES:
        if name != algorithm["name"]:
            for key in [k for k in algorithm if k.startswith(f"{name}_") and k not in EMA_KEYS]:
                del algorithm[key]
    for split in view["env"].values():  # other rewards' settings: left unset ('' or []) by a recipe that uses none
        reward = split["reward"]
        for key in [k for k, v in reward.items() if v in ("", [])]:
            del reward[key]
    return OmegaConf.create(view)


def start_run_files(log_dir: Path, cfg: DictConfig, command_line: str, config_name: str) -> None:
    """Create the run's folder with ``config.yaml`` and ``command.txt``: the command as typed, then the recipe it
    resolved to (a comment line, so the file still runs)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "config.yaml").write_text(to_yaml(cfg))
    (log_dir / "command.txt").write_text(f"{command_line}\n# recipe: {config_name}\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        cfg = load_recipe(args.config_name, args.overrides)
    except RecipeError as err:
        print(f"rlrunner: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    log_dir = Path(args.log_dir) if args.log_dir else default_log_dir(cfg.runner.logger.log_path, args.config_name)
    if args.dry_run:  # validates and prints; creates nothing
        print(to_yaml(dry_run_view(cfg)), end="")
        print(f"rlrunner: recipe {args.config_name!r} is valid (dry run; other model families' and algorithms' "
              "keys, other families' own settings and unset reward settings left out above); a run would log to "
              f"{log_dir}", file=sys.stderr)
        return 0
    cfg = with_log_dir(cfg, log_dir)
    start_run_files(log_dir, cfg, args.command_line or shlex.join(["python", "-m", "rlrunner.commands.train", *argv]),
                    args.config_name)
    with console_copied_to(log_dir / "console.log"):  # from the run's first line to its last
        print(f"rlrunner: logging to {log_dir}", file=sys.stderr)
        return train(cfg, log_dir)


def train(cfg: DictConfig, log_dir: Path) -> int:
    """Run the recipe; how it ended (:func:`~rlrunner.run.outcome.run_outcome`) is one line and an exit status."""
    from rlrunner.run.runner import run

    try:
        run(cfg, log_dir)
    except BaseException as error:
        outcome = run_outcome(error)
        if not outcome.message:  # the driver's own bug: its traceback
            raise
        if outcome.detail:
            print(outcome.detail, file=sys.stderr)
        print(outcome.message, file=sys.stderr)
        return outcome.exit_code
    return run_outcome(None).exit_code


if __name__ == "__main__":
    sys.exit(main())
