"""Bytes per training step on each data path, measured in a real Ray run of a recipe (default: the tiny one).

    .venv/bin/python bench/data_plane_measured.py                       # tiny_nft_ocr, 2 steps (~1-2 min on CPU)
    .venv/bin/python bench/data_plane_measured.py --steps 3 env.train.total_num_envs=32   # dotted overrides
    .venv/bin/python bench/data_plane_measured.py --actor-ranks 2       # DDP over gloo: what each rank fetches
    .venv/bin/python bench/data_plane_measured.py --quick               # tiny sizes, 1 step (Ray's start dominates):
                                                                        # checks the script runs
                                                                        # (tests/project/test_bench_scripts.py)

Actor (``--actor-ranks`` CPU "devices"), rollout and env run as separate Ray actors. Every size is the pickled size
(protocol 5) of what crosses a process boundary, summed per step: what the driver receives from each worker method
and sends to it, and what each actor rank and the env workers fetch from the rollout workers' results in the object
store. The last
table is what a driver that relays the rollout (the data plane before object references and once-per-prompt
conditioning) would receive and send, built from the same measured tensors, and the ratio.
"""

from __future__ import annotations

import argparse
import collections
import os
import pickle
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlrunner.cluster import create_cluster, ray_backend
from rlrunner.recipe import load_recipe
from rlrunner.run import runner as runner_module
from rlrunner.run.run_logging import logs_samples_at
from rlrunner.workers.actor import ActorWorker
from rlrunner.workers.reward import RewardWorker

#: --quick: the tiny recipe at one step of one prompt x 2 samples, 2 Euler steps (recipe overrides before the
#: command line's)
QUICK_OVERRIDES = ["algorithm.group_size=2", "env.train.total_num_envs=2", "actor.micro_batch_size=2",
                   "actor.global_batch_size=2", "actor.model.tiny.num_steps=2"]


def nbytes(value) -> int:
    return len(pickle.dumps(value, protocol=5))


class MeasuredActor(ActorWorker):
    """Records what each update fetched: the rollout's training parts, split into latents and conditioning."""

    def update(self, rollout, index, sample_index, advantages, step):
        self.fetched = {"training parts": sum(nbytes(p) for p in rollout),
                        "  of which x0": sum(p.tensors["x0"].nbytes for p in rollout),
                        "  of which conditioning (once per prompt)": sum(v.nbytes for p in rollout
                                                                         for v in p.per_prompt.values()),
                        "conditioning if repeated per sample": sum(v.nbytes for p in rollout
                                                                   for v in p.per_sample().values())}
        return super().update(rollout, index, sample_index, advantages, step)

    def measured(self) -> dict[str, int]:
        return self.fetched


class MeasuredEnv(RewardWorker):
    """Records the scored parts (images, prompts) each submit fetched."""

    fetched = 0

    def submit(self, slices, split="train"):
        parts = {id(part): part for pieces in slices for part, _, _ in pieces}  # a part cut into several slices
        self.fetched += sum(nbytes(part) for part in parts.values())
        return super().submit(slices, split)

    def measured(self) -> int:
        fetched, self.fetched = self.fetched, 0
        return fetched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="tiny_nft_ocr")
    parser.add_argument("--steps", type=int, default=2, help="training steps; step 1 logs samples, later ones not")
    parser.add_argument("--actor-ranks", type=int, default=1, help="actor ranks (each fetches only its own rows)")
    parser.add_argument("overrides", nargs="*", help="dotted recipe overrides, as for the launcher")
    parser.add_argument("--quick", action="store_true", help=f"tiny sizes, 1 step: {' '.join(QUICK_OVERRIDES)} "
                                                             "(flags and overrides given beside it still win); "
                                                             "checks that the script runs")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(steps=1)
        args = parser.parse_args()
    import ray

    # the Ray workers start from a checkout too, whatever the current directory: rlrunner on their path
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    received, sent = collections.Counter(), collections.Counter()
    real_gather, real_submit = ray_backend.gather, ray_backend.RayWorkerGroup._submit

    def gather(role, ips, method, refs, timeout_s, **kwargs):
        results = real_gather(role, ips, method, refs, timeout_s, **kwargs)
        received[f"{role}.{method}"] += nbytes(results)
        return results

    def submit(group, method, per_rank, parts=None):
        # call() puts one payload in the object store for every rank: sized once, from the driver's own copy
        payloads = {id(p): ray.get(p) if isinstance(p, ray.ObjectRef) else p for _, p in per_rank}
        sent[f"{group.role}.{method}"] += sum(nbytes(payload) for payload in payloads.values())
        return real_submit(group, method, per_rank, parts)

    ray_backend.gather, ray_backend.RayWorkerGroup._submit = gather, submit
    runner_module.ActorWorker, runner_module.RewardWorker = MeasuredActor, MeasuredEnv
    n = args.actor_ranks
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_recipe(args.recipe, [
            f"runner.max_steps={args.steps}", "runner.val_before_train=false", "runner.val_check_interval=0",
            "runner.save_interval=0", f"runner.logger.log_path={tmp}", "cluster.backend=ray",
            f"cluster.num_devices_per_node={n + 2}",
            f"cluster.component_placement={{actor: 0-{n - 1}, rollout: {n}, env: {n + 1}}}",
            *(QUICK_OVERRIDES if args.quick else []), *args.overrides])
        with create_cluster(cfg.cluster) as cluster:
            runner = runner_module.Runner(cfg, Path(tmp), cluster)
            for step in range(1, args.steps + 1):
                received.clear()
                sent.clear()
                runner.train_step()
                step_received, step_sent = dict(received), dict(sent)
                actor, env = runner.actor.call("measured"), runner.env.call("measured")
                logs = logs_samples_at(cfg.runner.sample_log_interval, step)
                print(f"\nstep {step} ({'logs' if logs else 'does not log'} "
                      f"{cfg.runner.num_logged_samples} samples), bytes:")
                for name, value in sorted(step_received.items()):
                    print(f"  driver <- {name:28s} {value:>12,}")
                for name, value in sorted(step_sent.items()):
                    print(f"  driver -> {name:28s} {value:>12,}")
                for rank, fetched in enumerate(actor):
                    for name, value in fetched.items():
                        print(f"  actor rank {rank} <- rollout {name:40s} {value:>12,}")
                print(f"  env workers <- rollout scored parts (images, prompts)          {sum(env):>12,}")
            runner.close()
    actor_total = collections.Counter()
    for fetched in actor:  # the ranks' rows partition the step's samples
        actor_total.update(fetched)
    once = actor_total["  of which conditioning (once per prompt)"]
    repeated = actor_total["conditioning if repeated per sample"]
    relayed = actor_total["  of which x0"] + repeated + sum(env)  # x0, repeated conditioning, images: in, then out
    now_in, now_out = step_received["rollout.generate"], step_sent["env.submit"] + step_sent["actor.update"]
    print(f"\nlast step, rollout data through the driver: relayed {relayed:,} in and out; now {now_in:,} in "
          f"({relayed / max(now_in, 1):.0f}x less), {now_out:,} out ({relayed / max(now_out, 1):.0f}x less)")
    print(f"conditioning to the actor: {once:,} once per prompt vs {repeated:,} repeated ({repeated / once:.0f}x less, "
          f"group_size {cfg.algorithm.group_size})")

if __name__ == "__main__":
    main()
