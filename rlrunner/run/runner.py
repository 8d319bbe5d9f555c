"""The training loop (single controller): the driver calls worker groups; workers never call each other.

One step: rollout (EMA policy) → reward (overlapped with the next rollout round) → advantages → update →
EMA → weight sync (LoRA tensors only) → log → eval → checkpoint.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from rlrunner.algorithms.advantages import estimate_advantages, per_reward_normalized_advantages
from rlrunner.cluster import create_cluster, write_placement_report
from rlrunner.data.prompts import PromptSampler, load_datasets
from rlrunner.objectives import objective_class
from rlrunner.rewards import RewardOutput, RewardUnavailable
from rlrunner.run.checkpoint import complete_checkpoints
from rlrunner.run.checkpointer import Checkpointer
from rlrunner.run.preemption import FINISHED, Preempted, StopSignals
from rlrunner.run.rollout_scoring import RolloutHandles, RolloutScoring
from rlrunner.run.run_logging import log_samples, logs_samples_at, reward_metrics
from rlrunner.run.supervisor import supervise
from rlrunner.run.watch import Watch
from rlrunner.run.weight_sync import WeightSync
from rlrunner.step.batch import Batch
from rlrunner.step.checks import check_placement
from rlrunner.step.device_turns import DeviceTurns
from rlrunner.step.sizes import StepSizes
from rlrunner.tracking.console import eval_line, report_step, run_summary
from rlrunner.tracking.logger import RunLogger, StepTimer
from rlrunner.utils.device import precision_fallback_note
from rlrunner.utils.seeding import derive_seed, rng_state, set_rng_state
from rlrunner.workers.actor import ActorWorker
from rlrunner.workers.reward import RewardWorker, reward_settings
from rlrunner.workers.rollout import RolloutWorker

logger = logging.getLogger("rlrunner")


def _mean_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([d[k] for d in dicts])) for k in dicts[0]}


class Runner:
    """The single controller of a training run: it calls the actor, rollout and env (reward) worker groups, which
    never call each other, and holds the driver's state between steps.

    Its parts, each with its own state: the prompt sampler, :class:`~rlrunner.run.weight_sync.WeightSync` (which
    adapters the rollout holds), :class:`~rlrunner.run.checkpointer.Checkpointer` (where it saves, what it may
    resume), :class:`~rlrunner.run.watch.Watch` (the reward-hacking watch) and the device turns of collocated
    groups. :meth:`state_dict` is everything a checkpoint saves beside the actor's state, :meth:`load_state_dict`
    restores it, so a resumed run goes on exactly as the saved one would have.
    """

    def __init__(self, cfg: DictConfig, log_dir: Path, cluster: Any, *, resume_dir: str | None = None,
                 run_logger: RunLogger | None = None, stop_requested: Callable[[], str] | None = None) -> None:
        """Start the workers on ``cluster``, resume (``resume_dir``, default ``runner.resume_dir``), then open the
        trackers (a refused resume leaves none open) or keep writing to ``run_logger`` (a restarted run's).
        ``stop_requested``: the name of a signal that asked the run to stop, read between steps."""
        self.cfg, self.log_dir, self.cluster = cfg, Path(log_dir), cluster
        self.stop_requested = stop_requested or (lambda: "")
        run, alg, env = cfg.runner, cfg.algorithm, cfg.env
        placement = cluster.placement
        datasets = load_datasets(env)
        self.train_prompts, self.eval_prompts = datasets["train"].prompts, datasets["eval"].prompts
        self.sampler = PromptSampler(len(self.train_prompts), derive_seed(run.seed, "prompts", 0))
        self.sizes = StepSizes.of(cfg, placement)  # every size of a step (rlrunner/step/sizes.py)
        self.max_steps = (run.max_steps if run.max_steps > 0
                          else run.max_epochs * self.sizes.steps_per_epoch(len(self.train_prompts)))
        # the LR schedule's length: fixed by max_steps, so a resume that changes it is checked (resume())
        self.lr_schedule_steps = self.sizes.lr_schedule_steps(self.max_steps)
        self.actor = cluster.spawn("actor", ActorWorker, placement.devices["actor"], cfg.actor, alg,
                                   self.lr_schedule_steps)
        self.rollout = cluster.spawn("rollout", RolloutWorker, placement.devices["rollout"], cfg.actor.model, run.seed,
                                     algorithm_cfg=alg, context_parallel_size=cfg.rollout.context_parallel_size)
        self.env = cluster.spawn("env", RewardWorker, placement.devices["env"], reward_settings(env, run.watch))
        self.watch = Watch(cfg, self.log_dir)  # the reward-hacking watch (rlrunner/run/watch.py)
        placed = write_placement_report([self.actor, self.rollout, self.env], self.log_dir)
        note = precision_fallback_note(cfg.actor.model.precision, cfg.actor.model.half_precision_on_cpu,
                                       {e["component"]: e["device"] for e in placed if e["component"] != "env"})
        if note:
            print(note, file=sys.stderr, flush=True)
        self.env.call("set_prompt_metadata", {split: data.metadata for split, data in datasets.items()})
        self.step = 0
        self.progress: tqdm | None = None  # the training progress bar, while fit() runs
        self.nonfinite_in_a_row = 0
        self.reward_failures_in_a_row = 0
        self.loss_key = objective_class(alg.name).loss_key  # the metric the step line reports as "loss"
        self.turns = DeviceTurns.for_placement(self.actor, self.rollout, placement, cfg.cluster.enable_offload)
        # runner.rollout_ahead: the next step's rollout, running in a driver thread during this step's update
        self.ahead: RolloutAhead | None = None
        self._ahead_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollout-ahead")
        self.scoring = RolloutScoring(cfg, self.sizes, self.turns, self.rollout, self.env,
                                      {"train": self.train_prompts, "eval": self.eval_prompts})
        self.weights = WeightSync(self.turns, self.rollout, objective_class(alg.name).sampling_adapter)
        model = cfg.actor.model
        family = model[model.model_type]
        self.checkpointer = Checkpointer(cfg, self.log_dir, {
            "model_type": model.model_type, "model_path": model.model_path,
            "lora_rank": family.lora_rank, "lora_alpha": family.lora_alpha})
        resume_dir = run.resume_dir if resume_dir is None else resume_dir
        if not (resume_dir and self.resume(resume_dir)):
            self.weights.sync(self.step)
        self.run_logger = run_logger or RunLogger(self.log_dir, run.logger, OmegaConf.to_container(cfg, resolve=True))

    # ------------------------------------------------------------------ the loop
    def fit(self) -> None:
        run, start, first_step = self.cfg.runner, time.monotonic(), self.step
        if self.step == 0 and run.val_before_train and run.val_check_interval >= 0:  # -1: never
            self.evaluate()
        progress = self.progress = tqdm(total=self.max_steps, initial=self.step, desc="train", unit="step",
                                        dynamic_ncols=True, file=sys.stderr, disable=not sys.stderr.isatty())
        while self.step < self.max_steps:
            if signal_name := self.stop_requested():  # a step boundary: the safe point to stop at
                progress.close()
                raise Preempted(signal_name, self.step, self.save() if 0 < self.step != self.saved_step else None)
            metrics = self.train_step()
            report_step(progress, self.step, self.max_steps, metrics, self.loss_key)
            last = self.step == self.max_steps
            if run.val_check_interval > 0 and (self.step % run.val_check_interval == 0 or last):
                self.evaluate()
            if (run.save_interval > 0 and self.step % run.save_interval == 0) or (last and run.save_interval >= 0):
                self.save()
            self.watch.stop_if_fired(self.step, self.save if self.step != self.saved_step else None)
        progress.close()
        tqdm.write(run_summary(self.log_dir, self.step - first_step, time.monotonic() - start,
                               self.run_logger.writer is not None, complete_checkpoints(self.log_dir / "checkpoints")),
                   file=sys.stderr)

    def train_step(self) -> dict[str, float]:
        """One global step as a straight line of named, timed phases."""
        timer = StepTimer()
        with timer("step"):
            rollout, reward = self.train_rollout(timer)
            self.check_reward_failure(reward)
            with timer("advantages"):
                advantages = self.advantages(reward)
            if self.cfg.runner.rollout_ahead and self.step + 1 < self.max_steps:
                self.start_rollout_ahead(self.sample_step_rows(), self.step + 1)
            with timer("train"):
                actor_metrics = self.update(rollout, advantages)
            with timer("rollout_wait"):
                if self.ahead is not None:  # rollout workers must finish the batch before their weights change
                    self.ahead.future.exception()
            with timer("ema"):
                tau = self.actor.call("ema_update", self.step)[0]
            self.step += 1
            with timer("sync"):
                if self.step % self.cfg.runner.weight_sync_interval == 0:
                    self.weights.sync(self.step)
        metrics = {**reward_metrics("env", reward), **actor_metrics, "train/actor/ema_tau": tau,
                   **timer.metrics()}
        self.run_logger.scalars(metrics, self.step)
        self.watch.train_reward(metrics["env/avg"])
        if logs_samples_at(self.cfg.runner.sample_log_interval, self.step):
            self.log_samples("train/samples", rollout.logged, reward)
        return metrics

    # ------------------------------------------------------------------ phases
    def sample_step_rows(self) -> list[int]:
        """This step's prompts, as rows of the training prompt set."""
        epochs = [self.sampler.sample(self.sizes.prompts_per_epoch) for _ in range(self.sizes.rollout_epochs)]
        return [row for epoch in epochs for row in epoch]

    def train_rollout(self, timer: StepTimer) -> tuple[RolloutHandles, RewardOutput]:
        """This step's rollout: the one started during the previous step, or a fresh one."""
        if self.ahead is None:
            return self.rollout_and_score(self.sample_step_rows(), self.cfg.algorithm.group_size, "train",
                                          timer, self.step)
        ahead, self.ahead = self.ahead, None
        rollout, reward = ahead.future.result()
        for phase in ("rollout", "reward"):  # spent during the previous step's update
            timer.seconds[f"{phase}_ahead"] = ahead.timer.seconds.get(phase, 0.0)
        return rollout, reward

    def start_rollout_ahead(self, rows: list[int], step: int) -> None:
        timer = StepTimer()
        future = self._ahead_pool.submit(self.rollout_and_score, rows, self.cfg.algorithm.group_size, "train",
                                         timer, step)
        self.ahead = RolloutAhead(rows, step, dict(self.weights.adapters), future, timer)

    def rollout_and_score(self, rows: list[int], group_size: int, mode: str, timer: StepTimer,
                          step: int) -> tuple[RolloutHandles, RewardOutput]:
        """Sample ``group_size`` images for each prompt (``rows`` of the split's prompt set) and score them
        (:class:`~rlrunner.run.rollout_scoring.RolloutScoring`), logging the first samples of an eval and of the
        training rollouts of steps that log theirs."""
        logs = mode != "train" or logs_samples_at(self.cfg.runner.sample_log_interval, step + 1)
        return self.scoring(rows, group_size, mode, timer, step, self.cfg.runner.num_logged_samples if logs else 0)

    def check_reward_failure(self, reward: RewardOutput) -> None:
        """Stop after ``runner.max_reward_error_steps`` steps in a row in which no sample could be scored."""
        self.reward_failures_in_a_row = self.reward_failures_in_a_row + 1 if reward.failure else 0
        limit = self.cfg.runner.max_reward_error_steps
        if self.reward_failures_in_a_row >= limit:
            raise RewardUnavailable(f"no training sample could be scored in {limit} step(s) in a row "
                                    f"(runner.max_reward_error_steps={limit}): {reward.failure}")

    def advantages(self, reward: RewardOutput) -> torch.Tensor:
        """Group-relative advantages (GDPO's of multi parts, if any); ``reward_signal`` none/shuffle are controls."""
        alg, keys = self.cfg.algorithm, [k for k in ("part_scores", "part_weights") if k in reward.extra]
        # copies: arrays that came through Ray's object store are read-only, which torch.from_numpy warns about
        rewards, *parts = [torch.tensor(a) for a in (reward.avg, *(reward.extra[k] for k in keys))]
        if alg.reward_signal == "none":
            return torch.zeros_like(rewards)
        if alg.reward_signal == "shuffle":
            generator = torch.Generator().manual_seed(derive_seed(self.cfg.runner.seed, "shuffle", self.step))
            order = torch.randperm(len(rewards), generator=generator)
            rewards, *parts = [a[order] for a in (rewards, *parts)]
        if parts:  # a multi reward with aggregation: per_reward_normalized
            return per_reward_normalized_advantages(*parts, alg.group_size, video_mode=alg.advantage_mode)
        return estimate_advantages(alg.adv_type, rewards, alg.group_size, alg.advantage_mode)

    def update(self, rollout: RolloutHandles, advantages: torch.Tensor) -> dict[str, float]:
        """Train on the step's samples as its :class:`TrainPlan` says: rank r gets the handles of its own rows of
        every rollout shard (it fetches them itself), where each sits in its training order, the positions (seeds
        of their training noise) and their advantages."""
        self.turns.hand_to("actor")
        plan = rollout.plan
        metrics = _mean_dicts(self.actor.scatter("update", [
            (rollout.train[plan.group_of(rank)], plan.local_index(rank), plan.group_positions(rank),
             advantages[plan.samples(rank)], self.step) for rank in range(self.actor.world_size)
        ]))
        self.nonfinite_in_a_row = self.nonfinite_in_a_row + 1 if metrics["nonfinite"] > 0 else 0
        if self.nonfinite_in_a_row >= self.cfg.runner.max_nonfinite_steps:
            raise RuntimeError(f"{self.nonfinite_in_a_row} steps in a row had a NaN/inf loss or gradient (optimizer "
                               f"steps skipped); lower actor.optim.lr or check the rewards/model precision")
        return {f"train/actor/{k}": v for k, v in metrics.items()}

    def evaluate(self) -> dict[str, float]:
        """Held-out prompts, one sample each, eval sampler and steps, fixed noise: comparable across steps."""
        timer = StepTimer()
        tqdm.write(eval_line(self.step, len(self.eval_prompts), self.cfg.actor.model), file=sys.stderr)
        with timer("eval"), self.weights.trained_adapter_on_rollout(self.step):  # the eval samples the trained adapter
            # step 0's noise at every eval: the same starting points, so steps differ only by the policy
            rollout, reward = self.rollout_and_score(list(range(len(self.eval_prompts))), 1, "eval", timer, step=0)
        metrics = {**reward_metrics("eval", reward), "time/eval": timer.seconds["eval"],
                   **self.watch.at_eval(self.step, reward, rollout.logged, self.run_logger)}
        self.run_logger.scalars(metrics, self.step)
        self.log_samples("eval/samples", rollout.logged, reward)
        tqdm.write(f"[step {self.step}] eval reward {metrics['eval/avg']:.4f} over {rollout.num_samples} held-out "
                   f"prompts", file=sys.stderr)
        return metrics

    def log_samples(self, tag: str, logged: Batch, reward: RewardOutput) -> None:
        log_samples(self.run_logger, self.cfg.env, self.log_dir, tag, logged, reward, self.step)

    # ------------------------------------------------------------------ state and checkpoints
    @property
    def saved_step(self) -> int:
        """The global step of the newest checkpoint of this run (or the one it resumed); -1: none."""
        return self.checkpointer.saved_step

    def state_dict(self) -> dict[str, Any]:
        """The driver's state, which a checkpoint saves beside the actor's: the step, the prompt sampler, the driver
        RNG, the failure counters, the reward-hacking watch, the rollout's adapters (:class:`WeightSync`), a rollout
        started ahead, and what a resume must not change (:data:`~rlrunner.run.checkpointer.RESUME_RULES`)."""
        return {"step": self.step, "sampler": self.sampler.state_dict(), "rng": rng_state(),
                "nonfinite_in_a_row": self.nonfinite_in_a_row,
                "reward_failures_in_a_row": self.reward_failures_in_a_row,
                "lr_schedule_steps": self.lr_schedule_steps, "rollout_world_size": self.rollout.world_size,
                "watch": self.watch.state_dict(), **self.weights.state_dict(self.step),
                # a rollout started ahead is replayed on resume: its prompt rows and the adapters that sampled it
                "ahead": None if self.ahead is None else {"rows": self.ahead.rows, "step": self.ahead.step,
                                                          "adapters": self.ahead.adapters}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the rollout workers get the adapters they held (keys that older checkpoints
        lack start as a new run's)."""
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.step = state["step"]
        self.nonfinite_in_a_row = state["nonfinite_in_a_row"]
        self.reward_failures_in_a_row = state.get("reward_failures_in_a_row", 0)
        self.watch.load_state_dict(state.get("watch"))
        if (ahead := state.get("ahead")) is not None:
            self.weights.send(ahead["adapters"])
            self.start_rollout_ahead(ahead["rows"], ahead["step"])
            self.ahead.future.exception()
        self.weights.load_state_dict(state, self.step)

    def save(self) -> Path:
        """Checkpoint this step: :meth:`state_dict` and the actor's state (rank-independent; every rank gathers,
        rank 0 returns)."""
        return self.checkpointer.save(self.step, self.state_dict(), self.turns.actor_call("state_dict")[0])

    def resume(self, resume_dir: str) -> bool:
        """Restore the checkpoint ``resume_dir`` names (:meth:`Checkpointer.find`), the rollout workers' adapters
        included; False when ``auto`` finds none yet."""
        path = self.checkpointer.find(resume_dir)
        if path is None:
            return False
        ckpt = self.checkpointer.load(path, self.actor.world_size, {
            "lr_schedule_steps": self.lr_schedule_steps, "lr_scheduler": self.cfg.actor.optim.lr_scheduler,
            "rollout_world_size": self.rollout.world_size, "rollout_cp": self.sizes.rollout_cp})
        self.turns.actor_call("load_state_dict", ckpt["actor"])
        self.load_state_dict(ckpt["runner"])
        tqdm.write(f"resumed from {path} at step {self.step}", file=sys.stderr)
        return True

    # ------------------------------------------------------------------ the end
    def abandon(self) -> None:
        """Stop the driver's own threads and progress bar (the workers are the cluster's to stop)."""
        if self.progress is not None:  # also after a failed step, so the bar is not redrawn after the error
            self.progress.close()
        self._ahead_pool.shutdown(wait=True, cancel_futures=True)

    def close(self, status: str = FINISHED) -> None:
        """Close the env workers, then the trackers with the run's ``status`` (finished, failed, preempted): always,
        and last. After a failure an env worker that cannot close (often the failure itself) is only a warning, so
        that the run's own error is the one that propagates."""
        try:
            self.abandon()
            self.env.call("close")
        except Exception as err:
            if status == FINISHED:
                raise
            logger.warning("the env workers did not close after the run %s: %s", status, getattr(err, "summary", err))
        finally:
            self.run_logger.close(status)


@dataclass
class RolloutAhead:
    """A training rollout started one step early (``runner.rollout_ahead``)."""

    rows: list[int]  # of the training prompt set
    step: int
    adapters: dict[str, Any]  # LoRA tensors the rollout workers sampled it with (flat per adapter)
    future: Future
    timer: StepTimer


def run(cfg: DictConfig, log_dir: Path) -> None:
    """Start the workers on the recipe's cluster, train (restarting them after a curable failure, stopping with a
    checkpoint on SIGTERM/SIGINT: :mod:`rlrunner.run.supervisor`), and always release the workers."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # in-process workers compute with as many threads as a Ray worker of cpus_per_worker CPUs would (Ray sets
    # OMP_NUM_THREADS so), which keeps the two backends' numbers identical under the same seed
    threads = torch.get_num_threads()
    if cfg.cluster.backend == "local":
        torch.set_num_threads(max(1, int(cfg.cluster.cpus_per_worker)))
    try:
        with create_cluster(cfg.cluster) as cluster, StopSignals(cfg.runner.save_on_signal) as stop:
            check_placement(cfg, cluster.placement)  # again: a joined Ray cluster's devices may differ from ours

            def start(resume_dir: str, run_logger: RunLogger | None) -> Runner:
                random.seed(cfg.runner.seed)  # a restart from step 0 draws what the first start drew
                np.random.seed(cfg.runner.seed % 2**32)
                torch.manual_seed(cfg.runner.seed)
                return Runner(cfg, log_dir, cluster, resume_dir=resume_dir, run_logger=run_logger,
                              stop_requested=stop)

            supervise(cluster, cfg, log_dir, start, stop)
    finally:
        torch.set_num_threads(threads)
