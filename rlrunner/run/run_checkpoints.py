"""A run's checkpoints as the driver writes and reads them: what the runner saves beside the actor's state, and a
resume that goes on exactly as the saved run would have, or is refused with one line (the files themselves:
:mod:`rlrunner.run.checkpoint`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from tqdm import tqdm

from rlrunner.config.loader import to_yaml
from rlrunner.run.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, write_adapters
from rlrunner.run.checkpoint_index import saved_recipe
from rlrunner.run.resume_point import resume_point
from rlrunner.step.sizes import data_parallel_groups
from rlrunner.utils.seeding import rng_state, set_rng_state

# actor.optim.lr_scheduler values whose learning rates do not depend on the run's length
LENGTH_FREE_SCHEDULES = ("constant", "constant_with_warmup")


class RunCheckpoints:
    """Checkpoint methods of :class:`~rlrunner.run.runner.Runner`, which holds the state they save and restore (step,
    prompt sampler, counters, the rollout's adapters, a rollout started ahead and the reward-hacking watch) and the worker
    groups."""

    def save(self) -> Path:
        root = self.log_dir / "checkpoints"
        state = {"step": self.step, "sampler": self.sampler.state_dict(), "rng": rng_state(),
                 "nonfinite_in_a_row": self.nonfinite_in_a_row,
                 "reward_failures_in_a_row": self.reward_failures_in_a_row,
                 # what a resume must not change (check_resumable), and the adapters the rollout holds when the
                 # last sync was before this step (runner.weight_sync_interval > 1): a resume must not sync newer
                 "lr_schedule_steps": self.lr_schedule_steps, "rollout_world_size": self.rollout.world_size,
                 "synced_step": self.synced_step,
                 "watch": self.watch.state_dict(),  # the guards' first values and the training reward's history
                 "rollout_adapters": self.rollout_adapters if self.synced_step != self.step else None,
                 # a rollout started ahead is replayed on resume: its prompt rows and the adapters that sampled it
                 "ahead": None if self.ahead is None else {"rows": self.ahead.rows, "step": self.ahead.step,
                                                           "adapters": self.ahead.adapters}}
        actor_state = self.turns.actor_call("state_dict")[0]  # rank-independent; every rank gathers, rank 0 returns
        path = save_checkpoint(
            root, self.step, runner_state=state, actor_state=actor_state, config_yaml=to_yaml(self.cfg),
            model_info=self.model_info, keep_last_n=self.cfg.runner.keep_last_n,
            write_adapters=lambda d: write_adapters(d, actor_state["adapters"], self.cfg.actor.model))
        tqdm.write(f"[step {self.step}] checkpoint saved to {path}", file=sys.stderr)
        self.saved_step = self.step
        return path

    def resume(self, resume_dir: str) -> bool:
        """Restore a checkpoint, the rollout workers' adapters included; False when ``auto`` finds none yet."""
        # auto: a checkpoint of this experiment, among the runs beside this one (where this launcher writes)
        path = resume_point(resume_dir, self.log_dir.resolve().parent, OmegaConf.to_container(self.cfg, resolve=True))
        if path is None:
            return False
        ckpt = load_checkpoint(path, self.model_info, self.actor.world_size)
        self.check_resumable(path, ckpt["runner"])
        self.turns.actor_call("load_state_dict", ckpt["actor"])
        self.sampler.load_state_dict(ckpt["runner"]["sampler"])
        set_rng_state(ckpt["runner"]["rng"])
        self.step = ckpt["runner"]["step"]
        self.nonfinite_in_a_row = ckpt["runner"]["nonfinite_in_a_row"]
        self.reward_failures_in_a_row = ckpt["runner"].get("reward_failures_in_a_row", 0)
        self.saved_step = self.step
        self.watch.load_state_dict(ckpt["runner"].get("watch"))
        ahead = ckpt["runner"].get("ahead")
        if ahead is not None:
            self.rollout.call("sync_weights", ahead["adapters"])
            self.rollout_adapters = ahead["adapters"]
            self.start_rollout_ahead(ahead["rows"], ahead["step"])
            self.ahead.future.exception()
        if (held := ckpt["runner"].get("rollout_adapters")) is not None:  # a sync the uninterrupted run had not made
            self.rollout.call("sync_weights", held)
            self.rollout_adapters, self.synced_step = held, ckpt["runner"]["synced_step"]
        else:
            self.sync_weights()
        tqdm.write(f"resumed from {path} at step {self.step}", file=sys.stderr)
        return True

    def check_resumable(self, path: Path, state: dict[str, Any]) -> None:
        """Refuse (one line) a resume that cannot go on as the saved run would have: another LR schedule length
        (``runner.max_steps`` sets it) or another number of rollout groups (:func:`check_rollout_groups`), unless
        ``runner.resume_allow_changes`` accepts the key (or is true)."""
        allow = self.cfg.runner.resume_allow_changes
        allowed = (lambda key: True) if allow is True else (lambda key: key in (allow or []))
        saved_length, scheduler = state.get("lr_schedule_steps"), self.cfg.actor.optim.lr_scheduler
        if (saved_length not in (None, self.lr_schedule_steps) and scheduler not in LENGTH_FREE_SCHEDULES
                and not allowed("runner.max_steps")):
            raise CheckpointError(
                f"checkpoint {path} was trained on a {scheduler} LR schedule {saved_length} optimizer steps long; "
                f"this recipe's run length makes it {self.lr_schedule_steps}, which changes every learning rate from "
                f"here on; resume with the checkpoint's runner.max_steps (or max_epochs), a constant "
                f"actor.optim.lr_scheduler, or runner.resume_allow_changes=[runner.max_steps]")
        saved_ranks = state.get("rollout_world_size")
        if saved_ranks is not None and not allowed("cluster.component_placement"):
            saved_cp = saved_recipe(path).get("rollout", {}).get("context_parallel_size", 1)
            check_rollout_groups(path, (saved_ranks, saved_cp),
                                 (self.rollout.world_size, self.cfg.rollout.context_parallel_size))


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
        f"go on as it would have; place {data_parallel_groups(saved_ranks, saved_cp)} rollout {unit}(s) ({keys}), or accept another "
        f"continuation with runner.resume_allow_changes=[cluster.component_placement]")
