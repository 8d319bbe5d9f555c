"""Experiment trackers behind one small interface: wandb, swanlab and mlflow, each imported only when a recipe
names it in ``runner.logger.logger_backends``.

Each writes into the run's log folder unless its own environment variable sends it elsewhere: wandb follows
``WANDB_MODE`` (``offline`` keeps the run in ``<log_dir>/wandb``, no network), swanlab ``SWANLAB_MODE``
(``offline`` keeps it in ``<log_dir>/swanlog``), mlflow ``MLFLOW_TRACKING_URI`` (default: a file store in
``<log_dir>/mlruns``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import time
from pathlib import Path
from types import ModuleType
from typing import Protocol

import numpy as np

# backend name -> (module imported, pip package that provides it)
PACKAGES = {"wandb": ("wandb", "wandb"), "swanlab": ("swanlab", "swanlab"), "mlflow": ("mlflow", "mlflow-skinny")}


def install_hint(name: str) -> str:
    """One line that says what to install for backend ``name``."""
    package = PACKAGES[name][1]
    return (f"runner.logger.logger_backends has {name!r} but {package} is not installed; pip install {package} "
            f"(or pip install -r requirements/loggers.txt), or drop {name!r} from the list")


def missing(names: list[str]) -> list[str]:
    """The backends among ``names`` whose package is not installed (found without importing it)."""
    return [n for n in names if n in PACKAGES and importlib.util.find_spec(PACKAGES[n][0]) is None]


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(PACKAGES[name][0])
    except ImportError as err:
        raise ImportError(install_hint(name)) from err


# the training step, logged beside every tracker's scalars: their own step only grows (RunLogger), this one is
# the step the run trained, also when a restart computes steps again
GLOBAL_STEP = "global_step"

# how each tracker spells the run's end (wandb: an exit code, and mark_preempting for preempted)
SWANLAB_STATES = {"finished": "success", "failed": "crashed", "preempted": "aborted"}
MLFLOW_STATES = {"finished": "FINISHED", "failed": "FAILED", "preempted": "KILLED"}


class Tracker(Protocol):
    """What RunLogger asks of an experiment tracker."""

    def scalars(self, metrics: dict[str, float], step: int) -> None: ...

    def image(self, tag: str, image: np.ndarray, caption: str, step: int) -> None: ...  # uint8 [H, W, 3]

    def close(self, status: str) -> None: ...  # status: finished | failed | preempted


class WandbTracker:
    def __init__(self, log_dir: Path, project: str, name: str, config: dict) -> None:
        self.wandb = _import("wandb")
        # the mode (online, offline, disabled) is wandb's own WANDB_MODE; dir keeps offline runs in the log folder
        self.run = self.wandb.init(project=project, name=name, dir=str(log_dir), config=config)
        # charts plot against the training step; step_sync gives images logged after a step's scalars its value
        self.run.define_metric(GLOBAL_STEP)
        self.run.define_metric("*", step_metric=GLOBAL_STEP, step_sync=True)

    def scalars(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def image(self, tag: str, image: np.ndarray, caption: str, step: int) -> None:
        self.run.log({tag: self.wandb.Image(image, caption=caption)}, step=step)

    def close(self, status: str) -> None:
        if status == "preempted":  # wandb shows the run as preempted, not crashed
            self.run.mark_preempting()
        self.run.finish(exit_code=0 if status == "finished" else 1)
        # finish() returns once the exit is recorded, but wandb's service process may still hold the run file's last
        # records in its buffer; teardown waits for the service to close it, so the run folder is whole when the
        # logger closes, even if the driver exits right after (a preempted run does)
        self.wandb.teardown()


class SwanlabTracker:
    def __init__(self, log_dir: Path, project: str, name: str, config: dict) -> None:
        self.swanlab = _import("swanlab")
        # the mode (cloud, offline, disabled) is swanlab's own SWANLAB_MODE; offline runs stay in the log folder
        self.run = self.swanlab.init(project=project, name=name, log_dir=str(log_dir / "swanlog"), config=config)

    def scalars(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def image(self, tag: str, image: np.ndarray, caption: str, step: int) -> None:
        self.run.log({tag: self.swanlab.Image(image, caption=caption)}, step=step)

    def close(self, status: str) -> None:
        self.run.finish(state=SWANLAB_STATES[status])


class MlflowTracker:
    def __init__(self, log_dir: Path, project: str, name: str, config: dict) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"file:{(log_dir / 'mlruns').resolve()}"
        if uri.startswith("file:"):
            # mlflow 3 refuses its file store unless asked; a local folder is exactly what this default is for
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        tracking = _import("mlflow").tracking
        from mlflow.entities import Metric, Param

        self.Metric = Metric
        self.client = tracking.MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
        self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
        # mlflow keys allow [\w\-. /] only (placement keys have commas); values are cut to mlflow's limit
        params = [Param(re.sub(r"[^\w\-. /]", "_", key), str(value)[:500]) for key, value in _flat(config).items()]
        for start in range(0, len(params), 100):  # and per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def scalars(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.Metric(k, v, now, step) for k, v in metrics.items()])

    def image(self, tag: str, image: np.ndarray, caption: str, step: int) -> None:
        self.client.log_image(self.run_id, image, key=tag, step=step)

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=MLFLOW_STATES[status])


def _flat(config: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out: dict = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


TRACKERS: dict[str, type] = {"wandb": WandbTracker, "swanlab": SwanlabTracker, "mlflow": MlflowTracker}


def open_trackers(names: list[str], log_dir: Path, project: str, name: str, config: dict) -> list[Tracker]:
    """The trackers of ``names`` that are experiment trackers (tensorboard is RunLogger's own)."""
    return [TRACKERS[n](log_dir, project, name, config) for n in names if n in TRACKERS]
