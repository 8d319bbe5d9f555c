"""Command-line entry point: ``python -m rlrunner.train --config-name NAME [key=value ...] [--dry-run]``.

``examples/diffusion/run_diffusion.sh`` calls this with ``--log-dir``; used directly, it makes
``logs/<YYYYmmdd-HHMMSS>-<config_name>/`` itself. User errors print one line and exit with status 2; a worker
that raised, died or hung ends the run with status 1 and a last line naming its component and rank (a node that
lacks rlrunner or a recipe folder is a user error: status 2, one line naming the node and the fix).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from rlrunner.config.loader import DEFAULT_RECIPE, RecipeError, load_recipe, to_yaml

EXIT_USER_ERROR = 2
EXIT_WORKER_FAILED = 1
EXIT_REWARD_UNAVAILABLE = 3


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m rlrunner.train",
        description="Run an rlrunner recipe (examples/diffusion/config/<name>.yaml) with dotted key=value overrides.",
    )
    parser.add_argument("--config-name", default=DEFAULT_RECIPE, help="recipe file stem or path to a .yaml")
    parser.add_argument("--log-dir", default="", help="run directory (default: logs/<timestamp>-<config_name>)")
    parser.add_argument("--dry-run", action="store_true", help="validate and print the resolved recipe; start nothing")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.optim.lr=1e-4")
    # --dry-run may stand anywhere, also between overrides
    return parser.parse_intermixed_args(argv)


def default_log_dir(cfg_log_path: str, config_name: str) -> Path:
    return Path(cfg_log_path) / f"{time.strftime('%Y%m%d-%H%M%S')}-{Path(config_name).stem}"


class _Tee:
    """Copy a stream to the run's console log when the launcher is not doing it."""

    def __init__(self, stream, log_file) -> None:
        self.stream, self.log_file = stream, log_file

    def write(self, data: str) -> int:
        if "\r" not in data:  # progress-bar redraws stay on the terminal, out of the log
            self.log_file.write(data)
        return self.stream.write(data)

    def flush(self) -> None:
        self.log_file.flush()
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        cfg = load_recipe(args.config_name, args.overrides)
    except RecipeError as err:
        print(f"rlrunner: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    launched_by_script = bool(args.log_dir)
    if args.dry_run and not launched_by_script:
        print(to_yaml(cfg), end="")
        print(f"rlrunner: recipe {args.config_name!r} is valid (dry run)", file=sys.stderr)
        return 0
    log_dir = Path(args.log_dir) if launched_by_script else default_log_dir(cfg.runner.logger.log_path,
                                                                            args.config_name)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "config.yaml").write_text(to_yaml(cfg))
    if not launched_by_script:
        command = shlex.join(["python", "-m", "rlrunner.train", *argv])
        (log_dir / "command.txt").write_text(command + "\n")
        console = open(log_dir / "console.log", "a", buffering=1)  # noqa: SIM115 (lives as long as the run)
        sys.stdout, sys.stderr = _Tee(sys.stdout, console), _Tee(sys.stderr, console)
    if args.dry_run:
        print(to_yaml(cfg), end="")
        print(f"rlrunner: recipe {args.config_name!r} is valid (dry run; resolved config in {log_dir}/config.yaml)",
              file=sys.stderr)
        return 0
    from rlrunner.checkpoint import CheckpointError
    from rlrunner.cluster import NodeSetupError, PlacementError, WorkerError
    from rlrunner.rewards import RewardUnavailable
    from rlrunner.runner import run

    try:
        run(cfg, log_dir)
    except (RecipeError, CheckpointError, PlacementError, NodeSetupError) as err:
        print(f"rlrunner: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except RewardUnavailable as err:  # no sample could be scored for runner.max_reward_error_steps steps
        print(f"rlrunner: error: {err}", file=sys.stderr)
        return EXIT_REWARD_UNAVAILABLE
    except WorkerError as err:
        if RewardUnavailable.__name__ in err.what:  # a required reward service is down at start: one line says it
            print(f"rlrunner: error: {err.summary}", file=sys.stderr)
            return EXIT_REWARD_UNAVAILABLE
        if err.detail:  # the worker's own traceback, or Ray's account of how its process ended
            print(err.detail.rstrip(), file=sys.stderr)
        print(f"rlrunner: error: {err.summary}; all workers stopped (runner.resume_dir=auto resumes from the "
              "last complete checkpoint)", file=sys.stderr)
        return EXIT_WORKER_FAILED
    except KeyboardInterrupt:
        print("rlrunner: interrupted; workers stopped (last complete checkpoint is kept)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
