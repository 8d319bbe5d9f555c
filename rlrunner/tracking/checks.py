"""The checks of the logger's keys (``runner.logger.*``), and across keys: each tracker named is installed.
Registered in :mod:`rlrunner.recipe`."""

from __future__ import annotations

from omegaconf import DictConfig

from rlrunner.config.check_kinds import Check, Choice, Context, Each, Free, InPathTable, names
from rlrunner.config.errors import fail as _fail
from rlrunner.tracking.logger import LOGGER_BACKENDS

KEY_CHECKS: dict[str, Check] = {
    "runner.logger.log_path": InPathTable("a folder, created at start"),
    "runner.logger.experiment_name": Free("any text"),
    "runner.logger.project_name": Free("any text"),
    "runner.logger.logger_backends": Each(Choice(names(LOGGER_BACKENDS))),
}


def check_logger(cfg: DictConfig, ctx: Context) -> None:
    """Each tracker in runner.logger.logger_backends is installed: found here, before any worker starts."""
    from rlrunner.tracking.backends import install_hint, missing

    absent = missing(list(cfg.runner.logger.logger_backends))
    if absent:
        _fail(install_hint(absent[0]))
