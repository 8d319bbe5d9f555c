"""The run's checkpointer: where a run saves, which checkpoint it resumes, and whether this recipe may resume it,
every rule in one table (:data:`RESUME_RULES`). The files of one checkpoint: :mod:`rlrunner.run.checkpoint`; which
checkpoint a resume, a restart or an export names: :mod:`rlrunner.run.checkpoint_index`.

A resume goes on exactly as the saved run would have, or is refused with one line naming each key that would
change that and how to accept it (``runner.resume_allow_changes``: a list of keys, or ``true`` for any).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from rlrunner.config.loader import to_yaml
from rlrunner.run.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, write_adapters
from rlrunner.run.checkpoint_index import experiment_of, find_checkpoint, saved_recipe
from rlrunner.step.sizes import data_parallel_groups

logger = logging.getLogger(__name__)

# actor.optim.lr_scheduler values whose learning rates do not depend on the run's length
LENGTH_FREE_SCHEDULES = ("constant", "constant_with_warmup")


@dataclass(frozen=True)
class ResumeRule:
    """Recipe keys a resumed run may change, and what must hold all the same.

    ``keys``: dotted keys, a key ending in ``.`` covering its section; ``holds(path, saved, now)`` raises a
    :class:`CheckpointError` when the run would not go on as checkpoint ``path`` would have (``saved``: the
    runner state saved there, ``now``: this run's ``lr_schedule_steps``, ``lr_scheduler``, ``rollout_world_size`` and
    ``rollout_cp``, its rollout's context parallel size); ``waived_by``: the
    ``runner.resume_allow_changes`` entry that skips ``holds``.
    """

    keys: tuple[str, ...]
    why: str
    holds: Callable[[Path, dict[str, Any], dict[str, Any]], None] | None = None
    waived_by: str = ""


def same_lr_schedule(path: Path, saved: dict[str, Any], now: dict[str, Any]) -> None:
    """A length-dependent LR schedule keeps its length (``runner.max_steps`` or ``max_epochs`` set it)."""
    saved_length, length, scheduler = saved.get("lr_schedule_steps"), now["lr_schedule_steps"], now["lr_scheduler"]
    if saved_length in (None, length) or scheduler in LENGTH_FREE_SCHEDULES:
        return
    raise CheckpointError(
        f"checkpoint {path} was trained on a {scheduler} LR schedule {saved_length} optimizer steps long; "
        f"this recipe's run length makes it {length}, which changes every learning rate from "
        f"here on; resume with the checkpoint's runner.max_steps (or max_epochs), a constant "
        f"actor.optim.lr_scheduler, or runner.resume_allow_changes=[runner.max_steps]")


def same_rollout_groups(path: Path, saved: dict[str, Any], now: dict[str, Any]) -> None:
    """As many rollout groups as the saved run had (:func:`check_rollout_groups`)."""
    if (saved_ranks := saved.get("rollout_world_size")) is None:  # a checkpoint older than the rule
        return
    saved_cp = saved_recipe(path).get("rollout", {}).get("context_parallel_size", 1)
    check_rollout_groups(path, (saved_ranks, saved_cp), (now["rollout_world_size"], now["rollout_cp"]))


#: What a resume may change. Any other key of the recipe saved with the checkpoint must be the same, unless
#: runner.resume_allow_changes lists it (or is true).
RESUME_RULES = (
    ResumeRule(("runner.max_steps", "runner.max_epochs"), "the run's length", same_lr_schedule,
               waived_by="runner.max_steps"),
    ResumeRule(("runner.logger.", "runner.log_dir", "runner.sample_log_interval", "runner.num_logged_samples",
                "runner.watch."), "what is logged and watched"),
    ResumeRule(("runner.val_check_interval", "runner.val_before_train"), "when the eval runs"),
    ResumeRule(("runner.save_interval", "runner.keep_last_n", "runner.save_on_signal", "runner.max_restarts"),
               "checkpointing and recovery"),
    ResumeRule(("runner.resume_dir", "runner.resume_allow_changes"), "the resume itself"),
    # the results do not depend on the number or place of the actor ranks, nor on DDP or FSDP2
    # (tests/workers/test_data_parallel.py); the rollout's groups do: they seed the rollout noise
    ResumeRule(("cluster.", "actor.strategy", "actor.one_rank_group"), "placement and the actor's engine",
               same_rollout_groups, waived_by="cluster.component_placement"),
)
RESUME_FREE_KEYS = tuple(key for rule in RESUME_RULES for key in rule.keys)


def check_rollout_groups(path: Path, saved: tuple[int, int], now: tuple[int, int]) -> None:
    """Refuse (one line) a resume whose rollout draws other noise: the noise is seeded per rollout group, and
    ``(ranks, rollout.context_parallel_size)`` (``saved``: the checkpoint's, ``now``: this run's) makes
    ranks / context_parallel_size groups: as many groups of other sizes go on as the saved run would have."""
    (saved_ranks, saved_cp), (ranks, cp) = saved, now
    if data_parallel_groups(saved_ranks, saved_cp) == data_parallel_groups(ranks, cp):
        return
    unit = "rank" if saved_cp == cp == 1 else "group"  # without context parallelism a rank is a group

    def groups(n: int, k: int) -> str:
        return "" if unit == "rank" else f" (rollout.context_parallel_size={k}: {data_parallel_groups(n, k)} group(s))"

    keys = "cluster.component_placement" + (", rollout.context_parallel_size" if unit == "group" else "")
    raise CheckpointError(
        f"checkpoint {path} was rolled out by {saved_ranks} rollout rank(s){groups(saved_ranks, saved_cp)}, this "
        f"placement has {ranks}{groups(ranks, cp)}: rollout noise is drawn per rollout {unit}, so the run would not "
        f"go on as it would have; place {data_parallel_groups(saved_ranks, saved_cp)} rollout {unit}(s) ({keys}), "
        f"or accept another continuation with runner.resume_allow_changes=[cluster.component_placement]")


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix[:-1]: node}
    return {k: v for key, value in node.items() for k, v in _flat(value, f"{prefix}{key}.").items()}


def recipe_changes(ckpt: Path, recipe: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{dotted key: (checkpoint's value, recipe's value)}`` for the keys where the resolved ``recipe`` differs
    from the one saved with ``ckpt``, but for the keys of :data:`RESUME_RULES`."""
    saved, now = _flat(saved_recipe(ckpt)), _flat(recipe)
    return {key: (saved.get(key), now.get(key)) for key in sorted(saved.keys() | now.keys())
            if saved.get(key) != now.get(key) and not key.startswith(RESUME_FREE_KEYS)}


def check_resume_recipe(ckpt: Path, recipe: dict[str, Any], resume_dir: str) -> None:
    """Refuse (one line naming the keys) to resume ``ckpt``, found through ``resume_dir``, into a recipe that
    differs from its own, but for the keys its ``runner.resume_allow_changes`` lists (``true``: any)."""
    allow = recipe["runner"]["resume_allow_changes"]
    if allow is True:
        return
    changes = recipe_changes(ckpt, recipe)
    changed = [key for key in changes if key not in (allow or [])]
    if not changed:
        return
    shown = ", ".join(f"{key} ({changes[key][0]!r} -> {changes[key][1]!r})" for key in changed)
    if resume_dir == "auto":
        which = f"runner.resume_dir=auto: the newest checkpoint of experiment {experiment_of(ckpt)!r}, {ckpt},"
        other = ", or start a separate experiment with its own runner.logger.experiment_name"
    else:
        which, other = f"runner.resume_dir={resume_dir!r}: checkpoint {ckpt}", ""
    raise CheckpointError(f"{which} was made with a different recipe: {shown}; resume it anyway with "
                          f"runner.resume_allow_changes=[{','.join(changed)}] (or true){other}")


def check_resume_state(path: Path, saved: dict[str, Any], now: dict[str, Any], allow: bool | list[str] | None) -> None:
    """Refuse (one line) a resume that a rule's ``holds`` refuses, unless ``allow``
    (``runner.resume_allow_changes``) waives that rule."""
    for rule in RESUME_RULES:
        if rule.holds is not None and not (allow is True or rule.waived_by in (allow or [])):
            rule.holds(path, saved, now)


def resume_point(resume_dir: str, log_root: Path, recipe: dict[str, Any]) -> Path | None:
    """The checkpoint a run with the resolved ``recipe`` resumes from (:func:`find_checkpoint`; ``log_root``: the
    folder holding the run folders, where ``auto`` looks), its recipe checked (:func:`check_resume_recipe`); None
    for ``auto`` without one yet.

    Raises:
        CheckpointError: no such checkpoint, none that reads back, or one made with another recipe.
    """
    experiment = recipe["runner"]["logger"]["experiment_name"]
    found = find_checkpoint(resume_dir, log_root, experiment)
    if found is None:
        # the same command line is re-issued after every preemption, also one that struck before the first save
        logger.warning("runner.resume_dir=auto: no complete checkpoint of experiment %r under %s/*/checkpoints yet; "
                       "starting from scratch", experiment, log_root)
        return None
    check_resume_recipe(found, recipe, resume_dir)
    return found


class Checkpointer:
    """Saves a run's checkpoints under ``<log_dir>/checkpoints`` and finds, reads and checks the one it resumes.

    ``model_info``: the model settings a checkpoint must match to load (:func:`load_checkpoint`).
    """

    def __init__(self, cfg: DictConfig, log_dir: Path, model_info: dict[str, Any]) -> None:
        self.cfg, self.log_dir, self.model_info = cfg, log_dir, model_info
        self.root = log_dir / "checkpoints"
        self.saved_step = -1  # the global step of the newest checkpoint of this run (or the one it resumed)

    def save(self, step: int, runner_state: dict[str, Any], actor_state: dict[str, Any]) -> Path:
        """Write global step ``step``'s checkpoint (the runner's and the actor's state, the adapters in diffusers'
        format), verified before older ones are pruned (``runner.keep_last_n``)."""
        path = save_checkpoint(
            self.root, step, runner_state=runner_state, actor_state=actor_state, config_yaml=to_yaml(self.cfg),
            model_info=self.model_info, keep_last_n=self.cfg.runner.keep_last_n,
            write_adapters=lambda d: write_adapters(d, actor_state["adapters"], self.cfg.actor.model))
        tqdm.write(f"[step {step}] checkpoint saved to {path}", file=sys.stderr)
        self.saved_step = step
        return path

    def find(self, resume_dir: str) -> Path | None:
        """The checkpoint ``resume_dir`` names, its recipe checked against this one; None when ``auto`` finds none
        yet (``auto``: a checkpoint of this experiment, among the runs beside this one, where the launcher writes)."""
        return resume_point(resume_dir, self.log_dir.resolve().parent, OmegaConf.to_container(self.cfg, resolve=True))

    def load(self, path: Path, actor_world_size: int, now: dict[str, Any]) -> dict[str, Any]:
        """Read checkpoint ``path`` for ``actor_world_size`` actor ranks, refused (one line) where a rule of
        :data:`RESUME_RULES` says this run (``now``: as in :class:`ResumeRule`) would not go on as the saved one."""
        ckpt = load_checkpoint(path, self.model_info, actor_world_size)
        check_resume_state(path, ckpt["runner"], now, self.cfg.runner.resume_allow_changes)
        self.saved_step = ckpt["runner"]["step"]
        return ckpt
