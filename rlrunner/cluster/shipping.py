"""What a Ray node needs before a worker can start there, and the one line that says what it lacks.

A cluster shares nothing but Ray (docs/clusters.md "Clusters"): a node has Ray and the same Python packages, but
neither the checkout nor the driver's disk. So the driver ships the ``rlrunner`` package with the job (Ray's
``runtime_env`` ``py_modules``: the package folder only, never logs, virtualenvs or model folders) unless the
recipe says the nodes have it installed (``cluster.ship_code: false``), and each worker host checks that the
local folders its worker will read (a model folder, a LoRA folder) are there before the worker loads anything.
A node that lacks either fails with :class:`NodeSetupError`: one line naming the node, what is missing and the fix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import rlrunner
from rlrunner.config.paths import path_key

PACKAGE_DIR = Path(rlrunner.__file__).resolve().parent
# byte code is rebuilt on the node; shipping it would only change the package's hash between identical runs
SHIP_EXCLUDES = ["__pycache__", "*.pyc"]
_MISSING_MODULE = re.compile(r"No module named '(rlrunner[\w.]*)'")


class NodeSetupError(RuntimeError):
    """A node lacks something a worker needs to start (the rlrunner package, a folder of the recipe)."""


def job_runtime_env(ship_code: bool) -> dict[str, Any] | None:
    """Ray ``runtime_env`` of a job that joins a cluster: the rlrunner package as a ``py_module`` when
    ``ship_code``, None when the nodes have rlrunner installed (``cluster.ship_code: false``)."""
    return {"py_modules": [str(PACKAGE_DIR)], "excludes": SHIP_EXCLUDES} if ship_code else None


def missing_module(error_text: str) -> str | None:
    """The rlrunner module a worker process could not import, read from Ray's text of its failure; else None.

    Ray 2.60 reports it as the actor's death in its creation task (``RayActorError``, "failed to import on the
    worker ... ModuleNotFoundError: No module named 'rlrunner...'"), or as a task error when a call's arguments
    name a class the node cannot import.
    """
    found = _MISSING_MODULE.search(error_text)
    return found.group(1) if found else None


def import_failure_line(module: str) -> str:
    """The end of the one line for a node without rlrunner: what is missing and the two fixes."""
    return (f"cannot import {module} (rlrunner is not installed there); install the driver's rlrunner on that node, "
            "or set cluster.ship_code=true so that the driver ships it with the job")


def setup_failure(worker: str, error_text: str, cause: BaseException | None = None) -> NodeSetupError | None:
    """The one-line error of ``worker`` (``"actor worker rank 0 on <node>"``) when it failed because its node lacks
    rlrunner or a folder (Ray's text of the failure and, for a task error, its cause); None for any other failure."""
    if isinstance(cause, NodeSetupError):
        return NodeSetupError(f"{worker} {cause}")
    module = missing_module(error_text)
    return None if module is None else NodeSetupError(f"{worker} {import_failure_line(module)}")


def check_readable(paths: Mapping[str, str]) -> None:
    """Raise :class:`NodeSetupError` naming the first of ``paths`` (recipe key -> absolute local path, a worker's
    ``node_paths`` from the path table) that this node cannot read, with the fixes: a folder shared by every node,
    or (a model's key) a hub id."""
    for key, path in paths.items():
        if not os.access(path, os.R_OK):
            entry = path_key(key)
            what = "folder" if entry is None or entry.kind in ("folder", "model") else "file"
            hub = ", or use a hub id (org/name)" if entry is not None and entry.kind == "model" else ""
            raise NodeSetupError(f"cannot read {key}={path!r} (the {what} is on the driver's disk, not on this node); "
                                 f"put it in a folder every node mounts at the same path{hub}")
