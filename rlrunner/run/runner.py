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
from rlrunner.cluster import Handle, create_cluster, write_placement_report
from rlrunner.data.prompts import PromptSampler, load_datasets
from rlrunner.objectives import objective_class
from rlrunner.rewards import RewardOutput, RewardUnavailable
from rlrunner.run.checkpoint import complete_checkpoints
from rlrunner.run.preemption import FINISHED, Preempted, StopSignals
from rlrunner.run.run_checkpoints import RunCheckpoints
from rlrunner.run.run_logging import RunLogging
from rlrunner.run.supervisor import supervise
from rlrunner.run.watch import Watch
from rlrunner.run.weight_sync import WeightSync
from rlrunner.step.batch import Batch
from rlrunner.step.checks import check_placement
from rlrunner.step.data_plane import RolloutParts
from rlrunner.step.device_turns import DeviceTurns
from rlrunner.step.sample_order import TrainPlan
from rlrunner.step.shares import reward_slices, split_evenly
from rlrunner.step.sizes import StepSizes, rollout_rounds
from rlrunner.tracking.console import eval_line, report_step, run_summary
from rlrunner.tracking.logger import RunLogger, StepTimer
from rlrunner.utils.device import precision_fallback_note
from rlrunner.utils.seeding import derive_seed
from rlrunner.workers.actor import ActorWorker
from rlrunner.workers.env import EnvWorker, reward_settings
from rlrunner.workers.rollout import RolloutWorker

logger = logging.getLogger("rlrunner")


def _mean_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.mean([d[k] for d in dicts])) for k in dicts[0]}


class Runner(RunCheckpoints, RunLogging, WeightSync):
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
        self.env = cluster.spawn("env", EnvWorker, placement.devices["env"], reward_settings(env, run.watch))
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
        self.rollout_adapters: dict[str, Any] = {}  # the last sync's (flat per adapter), as the rollout holds them
        self.synced_step = -1  # the global step whose adapters the last sync sent
        self.saved_step = -1  # the global step of the newest checkpoint of this run (or the one it resumed)
        model = cfg.actor.model
        family = model[model.model_type]
        self.model_info = {"model_type": model.model_type, "model_path": model.model_path,
                           "lora_rank": family.lora_rank, "lora_alpha": family.lora_alpha}
        resume_dir = run.resume_dir if resume_dir is None else resume_dir
        if not (resume_dir and self.resume(resume_dir)):
            self.sync_weights()
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
                    self.sync_weights()
        metrics = {**self.reward_metrics("env", reward), **actor_metrics, "train/actor/ema_tau": tau,
                   **timer.metrics()}
        self.run_logger.scalars(metrics, self.step)
        self.watch.train_reward(metrics["env/avg"])
        if self.logs_samples_at(self.step):
            self.log_samples("train/samples", rollout.logged, reward)
        return metrics

    # ------------------------------------------------------------------ phases
    def sample_step_rows(self) -> list[int]:
        """This step's prompts, as rows of the training prompt set."""
        epochs = [self.sampler.sample(self.sizes.prompts_per_epoch) for _ in range(self.sizes.rollout_epochs)]
        return [row for epoch in epochs for row in epoch]

    def train_rollout(self, timer: StepTimer) -> tuple[Rollout, RewardOutput]:
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
        self.ahead = RolloutAhead(rows, step, dict(self.rollout_adapters), future, timer)

    def rollout_and_score(self, rows: list[int], group_size: int, mode: str, timer: StepTimer,
                          step: int) -> tuple[Rollout, RewardOutput]:
        """Sample ``group_size`` images for each prompt (``rows`` of the split's prompt set) and score them; scoring
        round k overlaps the rollout of round k+1. Each sample carries its row, and with it its metadata, to the
        reward.

        Splitting, once each: the prompts into rollout rounds (2 with ``runner.async_reward``), a round into one
        shard per rollout group (``rollout.context_parallel_size`` workers), its samples into one slice per scorer
        thread of each env worker (:meth:`submit_reward`), and (training) each shard's rows into one part per actor
        group, by the step's :class:`TrainPlan` (it depends only on the seed and ``step``). Each shard's result stays
        with its worker, cut there into the named parts of :class:`RolloutParts`; the driver holds :class:`Handle` s
        and fetches only the samples it logs.
        """
        self.turns.hand_to("rollout")
        rollout_cp, split = self.sizes.rollout_cp, "train" if mode == "train" else "eval"
        n_shards = self.sizes.rollout_groups
        texts = self.train_prompts if split == "train" else self.eval_prompts
        rounds = split_evenly(rows, rollout_rounds(len(rows), n_shards, self.cfg.runner.async_reward))
        plan = None
        if mode == "train":
            plan = TrainPlan.build(self.cfg.runner.seed, step, len(rows) * group_size,
                                   self.cfg.actor.global_batch_size, self.actor.world_size,
                                   self.cfg.actor.context_parallel_size)
        to_log = self.cfg.runner.num_logged_samples if mode != "train" or self.logs_samples_at(step + 1) else 0
        train: list[list[Handle[Batch]]] = [[] for _ in range(plan.groups if plan else 0)]
        logged: list[Batch] = []
        tickets, start = [], 0
        for index, round_rows in enumerate(rounds):
            shards = split_evenly(round_rows, n_shards)
            sizes = [len(shard) * group_size for shard in shards]
            offsets = np.cumsum([start, *sizes[:-1]]).tolist()
            with timer("rollout"):
                parts = RolloutParts(self.rollout.scatter_async(
                    "generate", [([texts[r] for r in shard], group_size, step, index, mode, shard)
                                 for shard in shards for _ in range(rollout_cp)],
                    per_rank_parts=RolloutParts.per_rank_cuts(plan, offsets, sizes, to_log, rollout_cp)),
                    len(train), rollout_cp)
                logged += parts.logged()  # waits for the round's rollout
            for group, handles in enumerate(train):
                handles += parts.train(group)
            tickets.append(self.submit_reward(parts.scored(), sizes, split))
            start += sum(sizes)
            if not self.cfg.runner.async_reward:
                with timer("reward"):
                    tickets[-1] = self.collect_reward(tickets[-1])
        with timer("reward"):
            rewards = [t if isinstance(t, RewardOutput) else self.collect_reward(t) for t in tickets]
        return Rollout(train, plan, Batch.cat(logged), start), RewardOutput.concat(rewards)

    def submit_reward(self, scored: list[Handle[Batch]], sizes: list[int], split: str) -> list[int]:
        """Hand the env workers one rollout round's samples, cut once (:func:`reward_slices`) into a slice per scorer
        thread of every env worker, as pieces ``(handle, start, stop)`` of the rollout shards' scored parts
        (``sizes`` samples each); returns their tickets."""
        threads = self.cfg.env[split].reward.num_workers
        per_worker = reward_slices(sizes, self.env.world_size, threads)
        return self.env.scatter("submit", [([[(scored[i], lo, hi) for i, lo, hi in piece] for piece in slices], split)
                                           for slices in per_worker])

    def collect_reward(self, tickets: list[int]) -> RewardOutput:
        return RewardOutput.concat(self.env.scatter("collect", [(t,) for t in tickets]))

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

    def update(self, rollout: Rollout, advantages: torch.Tensor) -> dict[str, float]:
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
        with timer("eval"), self.trained_adapter_on_rollout():  # the eval samples the trained adapter
            # step 0's noise at every eval: the same starting points, so steps differ only by the policy
            rollout, reward = self.rollout_and_score(list(range(len(self.eval_prompts))), 1, "eval", timer, step=0)
        metrics = {**self.reward_metrics("eval", reward), "time/eval": timer.seconds["eval"],
                   **self.watch.at_eval(self.step, reward, rollout.logged, self.run_logger)}
        self.run_logger.scalars(metrics, self.step)
        self.log_samples("eval/samples", rollout.logged, reward)
        tqdm.write(f"[step {self.step}] eval reward {metrics['eval/avg']:.4f} over {rollout.num_samples} held-out "
                   f"prompts", file=sys.stderr)
        return metrics

    # ------------------------------------------------------------------ checkpoints
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
class Rollout:
    """A rollout as the driver holds it: handles, never the tensors, except the few samples it logs."""

    # train[g]: actor group g's rows of every rollout shard's RolloutOutput.train, in sample order (none for eval)
    train: list[list[Handle[Batch]]]
    plan: TrainPlan | None  # who trains what (training rollouts only)
    logged: Batch  # images and prompts of the first runner.num_logged_samples samples (none when not logging)
    num_samples: int


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
