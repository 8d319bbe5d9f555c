"""Actor update seconds with 1 vs 2 actor ranks (gloo, Ray workers), and what the data-parallel engine costs.

    .venv/bin/python bench/actor_ranks.py [--steps 5] [--strategy ddp] [key=value ...]
    .venv/bin/python bench/actor_ranks.py --quick    # seconds, tiny sizes: checks that it runs (a test does)

Builds the default (tiny) recipe's actor on 1 and on 2 CPU devices, gives it one step's worth of synthetic
samples (``env.train.total_num_envs`` latents, real text conditioning) and times ``update`` (median of
``--steps`` after one warm-up; the three settings take turns, so machine load hits them alike) for:

* ``1 rank``: the single-process path, all samples;
* ``2 ranks``: DDP or FSDP2 (``--strategy``), each rank half the samples, gradients averaged by the engine;
* ``2 ranks, no engine``: the same two halves trained side by side without exchanging anything.

``engine overhead = (2 ranks - 2 ranks no engine) / 1 rank`` in CPU seconds summed over the ranks: the work the
engine (its hooks, gradient buckets and gloo collectives) adds when two ranks share the step, as a share of the
1-rank step; target < 10 %. CPU time is used because wall time on a shared 2-core machine swings by ±30 % from
round to round; the wall-time version and ``2 ranks / 1 rank`` (the speed-up, ideal 0.5 with two free cores) are
printed too, not judged. Every round's numbers are printed first. FSDP2 cannot be switched off (its hooks live on
the model's modules), so ``--strategy fsdp2`` prints its extra CPU work over one rank instead: the per-block weight
gathers of each forward and backward, which the memory saving costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests" / "helpers"))  # tests/helpers/family_helpers.py
# Ray's workers find rlrunner in the driver's working directory: run from elsewhere, they need the checkout's path
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

import torch
from family_helpers import encode_prompt_batch, make_noise

from rlrunner.cluster import create_cluster
from rlrunner.distributed.parallelize import Engine
from rlrunner.models import build_model
from rlrunner.recipe import load_recipe
from rlrunner.step.batch import Batch
from rlrunner.step.sample_order import optimizer_step_shards
from rlrunner.workers.actor import ActorWorker

#: ``--quick``: a step of two prompts' two samples, one micro-batch per rank
QUICK_OVERRIDES = ["algorithm.group_size=2", "env.train.total_num_envs=4", "actor.global_batch_size=4",
                   "actor.micro_batch_size=2"]


class BenchActor(ActorWorker):
    """An actor rank that reports the CPU seconds of its updates and can also train without its engine (on its
    share alone, exchanging nothing)."""

    def update(self, rollout: list[Batch], index: torch.Tensor, sample_index: torch.Tensor, advantages: torch.Tensor,
               step: int) -> dict[str, float]:
        start = time.process_time()  # this process's CPU time, gloo's threads included; waiting costs none
        metrics = super().update(rollout, index, sample_index, advantages, step)
        return {**metrics, "cpu_s": time.process_time() - start}

    def use_engine(self, on: bool) -> None:
        if not hasattr(self, "own_engine"):
            self.own_engine = self.engine
        self.engine = self.own_engine if on else Engine(self.model)


def synthetic_batch(cfg, num_samples: int) -> tuple[Batch, torch.Tensor]:
    """A rollout's training part of ``num_samples`` random clean latents with the recipe's prompts' real
    conditioning (once per prompt, as the rollout sends it), and random advantages ``[num_samples]``."""
    model = build_model(cfg.actor.model)
    prompts = [line for line in (Path(cfg.env.train.dataset.path) / "train.txt").read_text().splitlines() if line]
    num_prompts = num_samples // cfg.algorithm.group_size
    cond = encode_prompt_batch(model, prompts[:num_prompts])
    generator = torch.Generator().manual_seed(0)
    x0 = make_noise(model, num_samples, generator).clamp(-1, 1)
    prompt_index = torch.arange(num_prompts).repeat_interleave(cfg.algorithm.group_size)
    batch = Batch({"x0": x0}, {}, {f"cond.{k}": v.cpu() for k, v in cond.items()}, prompt_index)
    return batch, torch.randn(num_samples, generator=generator)


def time_updates(overrides: list[str], batch: Batch, advantages: torch.Tensor, steps: int, baseline: bool) -> dict[str, tuple[float, float]]:
    """Median (wall seconds, CPU seconds summed over ranks) of ``update`` on 1 rank, on 2 ranks and (``baseline``)
    on 2 ranks without the engine, interleaved round by round in one Ray session (all see the same machine load)."""
    cfg = load_recipe("tiny_nft_ocr", [*overrides, "cluster.backend=ray", "cluster.num_devices_per_node=3",
                                       "cluster.component_placement={actor: 0-1, rollout: 2, env: 2}"])
    with create_cluster(cfg.cluster) as cluster:
        two = cluster.spawn("actor", BenchActor, (0, 1), cfg.actor, cfg.algorithm, 1000)
        one = cluster.spawn("actor", BenchActor, (2,), cfg.actor, cfg.algorithm, 1000)  # in a rollout/env slot
        settings = {"1 rank": (one, True), "2 ranks": (two, True)}
        if baseline:
            settings["2 ranks, no engine"] = (two, False)
        seconds: dict[str, list[float]] = {name: [] for name in settings}
        cpu_seconds: dict[str, list[float]] = {name: [] for name in settings}
        for step in range(steps + 1):  # the first round is a warm-up
            for name, (group, engine) in settings.items():
                group.call("use_engine", engine)
                shards = optimizer_step_shards(len(batch), cfg.actor.global_batch_size, group.world_size)
                start = time.perf_counter()
                metrics = group.scatter("update", [([batch], shard, shard, advantages[shard], step)
                                                   for shard in shards])
                seconds[name].append(time.perf_counter() - start)
                cpu_seconds[name].append(sum(m["cpu_s"] for m in metrics))
    for name in settings:
        print(f"{name:<20} wall s per round: {' '.join(f'{v:.2f}' for v in seconds[name])}; CPU s: "
              f"{' '.join(f'{v:.2f}' for v in cpu_seconds[name])} (first round: warm-up)")
    return {name: (statistics.median(seconds[name][1:]), statistics.median(cpu_seconds[name][1:]))
            for name in settings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="timed updates per setting (after one warm-up)")
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp2"])
    parser.add_argument("--quick", action="store_true",
                        help="seconds, tiny sizes (4 samples, 1 timed update unless --steps says): checks that the "
                             "script runs (tests/project/test_bench_scripts.py)")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, e.g. actor.micro_batch_size=8")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(steps=1)
        args = parser.parse_args()
    overrides = [*(QUICK_OVERRIDES if args.quick else []), *args.overrides, f"actor.strategy={args.strategy}"]
    cfg = load_recipe("tiny_nft_ocr", overrides)
    batch, advantages = synthetic_batch(cfg, cfg.env.train.total_num_envs * cfg.env.train.rollout_epoch)
    # FSDP2's hooks live on the model's own modules: only DDP can be switched off for a no-engine baseline
    times = time_updates(overrides, batch, advantages, args.steps, baseline=args.strategy == "ddp")
    (one, one_cpu), (two, two_cpu) = times["1 rank"], times["2 ranks"]
    print(f"actor update of {len(batch)} samples (global_batch_size {cfg.actor.global_batch_size}, micro-batch "
          f"{cfg.actor.micro_batch_size}), median of {args.steps} after a warm-up, gloo on CPU")
    print(f"{'':<30}{'wall s':>8}{'CPU s':>8}   (CPU: summed over ranks)")
    for name, (wall, cpu) in times.items():
        print(f"{name.replace('2 ranks', '2 ranks, ' + args.strategy, 1) if name == '2 ranks' else name:<30}"
              f"{wall:8.3f}{cpu:8.3f}")
    print(f"2 ranks / 1 rank, wall = {two / one:.3f} (ideal 0.5 with 2 free cores; noisy on a shared machine)")
    if "2 ranks, no engine" in times:
        alone, alone_cpu = times["2 ranks, no engine"]
        print(f"engine overhead, CPU = (2 ranks - 2 ranks no engine) / 1 rank = "
              f"{100 * (two_cpu - alone_cpu) / one_cpu:.1f} % (target < 10 %)")
        print(f"engine overhead, wall = {100 * (two - alone) / one:.1f} % (noisy: both medians move with the load)")
    else:  # sharding trades memory for gathering every block's weights in each forward and backward
        print(f"fsdp2 extra work, CPU = (2 ranks - 1 rank) / 1 rank = {100 * (two_cpu - one_cpu) / one_cpu:.1f} % "
              f"(no target: FSDP2 is for models that do not fit, not for speed)")


if __name__ == "__main__":
    main()
