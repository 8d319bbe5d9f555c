"""The one table of a recipe's paths: what each path key names, where it is read and so where it is checked, and
how the driver makes every local path absolute before any worker sees it.

Where a path is checked (:data:`PATH_KEYS`, ``checked``):

* ``driver``: the driver reads it (prompt files, a checkpoint to resume); a missing one is a recipe error.
* ``node``: a worker reads it (the model folder, a reward's files) on its node; each worker host checks its
  worker's paths there before the worker starts (:func:`node_paths`, ``rlrunner.cluster.shipping.check_readable``:
  one line naming the node and the key). The driver checks them too when it is that node (an in-process run, or a
  Ray cluster it starts itself); when the run joins a cluster (``cluster.ray_address`` or ``RAY_ADDRESS``), a path
  missing on the driver is only a warning: the driver never reads it, and it may exist only on the GPU nodes.
* ``created``: the run writes it (log and video folders); never checked.

How a relative path resolves (workers run on other nodes in other folders, so they get absolute paths only): from
the folder the user typed the command in (:func:`launch_dir`: the launcher's ``RLRUNNER_CALLER_CWD``, else the
working directory) if it exists there, else from the checkout (:data:`REPO_DIR`, so the shipped recipes'
``examples/diffusion/...`` paths work from any folder) if it exists there, else it is an error naming both places
(or, for a ``node`` path of a run that joins a cluster, the launch folder's path with a warning). ``~`` is expanded.
A ``model`` key is a local path or a hub id ``org/name``: it is local when it starts with ``.``, ``/`` or ``~``,
exists, is not of the form ``org/name``, or its first component is a local folder (``models/sd3`` beside a
``models/`` folder is a missing folder, not a hub id to download).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlrunner.config.errors import RecipeError

logger = logging.getLogger("rlrunner")
REPO_DIR = Path(__file__).resolve().parents[2]  # the checkout: the shipped recipes' relative paths start here
NOT_A_PATH = ("", "auto")  # unset, and runner.resume_dir's "newest checkpoint of this recipe"
KINDS = {"file": "file", "folder": "folder", "file_or_folder": "file or folder", "model": "local folder or file"}


@dataclass(frozen=True)
class PathKey:
    """What a path key names and where it is checked (module docstring).

    Attributes:
        kind: ``file``, ``folder``, ``file_or_folder``, or ``model`` (a local folder or file, or a hub id).
        checked: ``driver``, ``node`` or ``created``.
        readers: the components whose workers read it on their node (``checked == "node"``).
    """

    kind: str
    checked: str
    readers: tuple[str, ...] = ()


_ENV = ("env",)
_MODEL = ("actor", "rollout")
# dotted key pattern -> its entry: ``<split>`` is train/eval, ``<family>`` a model family section; the reward keys
# also hold for each part of a multi reward (env.<split>.reward.rewards[i].<key>)
PATH_KEYS: dict[str, PathKey] = {
    "runner.resume_dir": PathKey("folder", "driver"),
    "runner.log_dir": PathKey("folder", "created"),
    "runner.logger.log_path": PathKey("folder", "created"),
    "env.<split>.dataset.path": PathKey("file_or_folder", "driver"),
    "env.<split>.video_cfg.video_base_dir": PathKey("folder", "created"),
    "env.<split>.reward.token_file": PathKey("file", "node", _ENV),
    "env.<split>.reward.api_key_file": PathKey("file", "node", _ENV),
    "env.<split>.reward.head_path": PathKey("file", "node", _ENV),
    "env.<split>.reward.model_path": PathKey("model", "node", _ENV),
    "env.<split>.reward.processor_path": PathKey("model", "node", _ENV),
    "actor.model.model_path": PathKey("model", "node", _MODEL),
    "actor.model.<family>.lora_path": PathKey("model", "node", _MODEL),
}


def _pattern(key: str) -> re.Pattern[str]:
    text = re.escape(key).replace("<split>", r"[^.\[\]]+").replace("<family>", r"[^.\[\]]+")
    text = text.replace(r"reward\.", r"reward\.(?:rewards\[\d+\]\.)?")
    return re.compile(f"^{text}$")


_PATTERNS = [(_pattern(key), entry) for key, entry in PATH_KEYS.items()]


def path_key(dotted: str) -> PathKey | None:
    """The table's entry of a dotted key (``env.train.reward.rewards[1].token_file``), or None."""
    return next((entry for pattern, entry in _PATTERNS if pattern.match(dotted)), None)


def path_values(section: Any, prefix: str) -> Iterator[tuple[str, str, PathKey]]:
    """``(dotted key, value, entry)`` of every set path in ``section`` (the recipe's section at ``prefix``, a
    config or plain mapping)."""
    plain = OmegaConf.to_container(section, resolve=True) if isinstance(section, DictConfig) else section
    yield from _walk(plain, prefix)


def _walk(node: Any, dotted: str) -> Iterator[tuple[str, str, PathKey]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{dotted}.{key}" if dotted else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{dotted}[{i}]")
    elif isinstance(node, str) and node not in NOT_A_PATH and (entry := path_key(dotted)) is not None:
        yield dotted, node, entry


def launch_dir() -> Path:
    """The folder the user typed the command in: the launcher changes into the checkout and says where it was."""
    return Path(os.environ.get("RLRUNNER_CALLER_CWD") or os.getcwd())


def joins_cluster(cluster: Any) -> bool:
    """Whether the run joins an existing Ray cluster (``cluster.ray_address`` or ``RAY_ADDRESS``), whose nodes may
    hold folders that the driver's machine does not."""
    return cluster.backend == "ray" and bool(cluster.ray_address or os.environ.get("RAY_ADDRESS"))


def _exists(path: Path, kind: str) -> bool:
    return path.is_file() if kind == "file" else path.is_dir() if kind == "folder" else path.exists()


def is_local_path(value: str, bases: tuple[Path, ...]) -> bool:
    """Whether a ``model`` value names a local folder or file rather than a hub id ``org/name`` (module docstring)."""
    if value.startswith((".", "/", "~")) or value.count("/") != 1:
        return True
    first = value.split("/")[0]
    return any((base / value).exists() or (base / first).is_dir() for base in bases)


def resolve(dotted: str, value: str, entry: PathKey, *, bases: tuple[Path, ...], lenient: bool) -> str:
    """``value`` as an absolute path (or a hub id as it is), by the rule of the module docstring.

    Args:
        dotted: the key, for messages.
        bases: where relative paths are looked for, in order (the launch folder, then the checkout).
        lenient: a missing path is a warning, not an error (a ``node`` path of a run that joins a cluster, or a
            ``driver`` path that the tool at hand does not read).

    Raises:
        RecipeError: one line naming the key, the value and the places tried.
    """
    if entry.kind == "model" and not is_local_path(value, bases):
        return value
    path = Path(value).expanduser()
    tried = [path] if path.is_absolute() else list(dict.fromkeys(base / path for base in bases))
    if entry.checked == "created":  # an output folder: where the user is, whatever exists
        return os.path.normpath(tried[0])
    found = next((p for p in tried if _exists(p, entry.kind)), None)
    if found is not None:
        return os.path.normpath(found)
    where = "" if path.is_absolute() else f" (tried {' and '.join(map(str, tried))})"
    if lenient:
        if entry.checked == "node":
            logger.warning("%s=%r does not exist on this machine%s; the run joins a cluster, so each node that "
                           "reads it checks it there", dotted, value, where)
        return os.path.normpath(tried[0])
    unset = " or ''" + (" or 'auto'" if dotted == "runner.resume_dir" else "")
    hint = "; or use a hub id like org/name" if entry.kind == "model" else ""
    raise RecipeError(f"{dotted}={value!r} does not exist{where}; give an existing {KINDS[entry.kind]}{unset}{hint}")


def resolve_paths(cfg: DictConfig, *, check_driver_paths: bool = True) -> None:
    """Rewrite, in place, every local path of ``cfg`` (a merged recipe) as an absolute path, checking each where
    the table says (module docstring). ``check_driver_paths=False``: the tool at hand reads no prompts."""
    bases = (launch_dir(), REPO_DIR)
    joins = joins_cluster(cfg.cluster)
    for dotted, value, entry in list(path_values(cfg, "")):
        lenient = (entry.checked == "node" and joins) or (entry.checked == "driver" and not check_driver_paths
                                                          and dotted != "runner.resume_dir")
        OmegaConf.update(cfg, dotted, resolve(dotted, value, entry, bases=bases, lenient=lenient))


def node_paths(component: str, section: Any, prefix: str) -> dict[str, str]:
    """The local paths (recipe key -> absolute path) that a worker of ``component`` reads on its node, from the
    recipe section it is built from (``section``, the recipe's ``prefix``: ``actor``, ``actor.model``, ``env``).
    Hub ids are left out; the driver made every local path absolute."""
    return {dotted: value for dotted, value, entry in path_values(section, prefix)
            if entry.checked == "node" and component in entry.readers and os.path.isabs(value)}
