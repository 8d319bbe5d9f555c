"""What a lost worker costs: the time from its death to the first step after recovery, and the steps lost.

    .venv/bin/python bench/recovery.py [--role actor|rollout|env] [--steps 4] [--kill-after 2] [key=value ...]
    .venv/bin/python bench/recovery.py --quick  # tiny sizes, 3 steps, 1-2 min (Ray): tests/project/test_bench_scripts.py

Runs the CPU recipe (``tiny_nft_ocr``: the tiny model, the real OCR reward) on a one-node Ray started here, with
its actor, rollout and env workers as separate Ray actors, ``runner.save_interval=1`` and no evals. Once
``global_step_<kill-after>`` is saved, it waits half a step and SIGKILLs the ``--role`` worker's process, then
prints:

* ``death -> first step after recovery``: from the SIGKILL to the first training step logged by the new workers;
  split into the restart itself (tear down, rejoin, start the workers, resume: ``restarts.jsonl``'s ``seconds``)
  and the rest (noticing the death, the step itself);
* ``steps lost``: finished steps that were not checkpointed (0 with ``save_interval: 1`` unless the kill hits a
  save), and the step in progress, computed again;
* ``step``: the median seconds per step before the kill, for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing rlrunner
# Ray's workers find rlrunner in the driver's working directory: run from elsewhere, they need the checkout's path
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
from rlrunner.recipe import load_recipe
from rlrunner.run.checkpoint import complete_checkpoints
from rlrunner.run.runner import run

RECIPE = ["cluster.backend=ray", "cluster.num_devices_per_node=3",
          "cluster.component_placement={actor: 0, rollout: 1, env: 2}", "runner.save_interval=1",
          "runner.val_before_train=false", "runner.val_check_interval=0", "runner.sample_log_interval=0"]
#: ``--quick``: the fewest steps that leave one to run after the killed one, of one prompt x 2 samples and 2
#: sampling steps; the Ray start and the workers' start and restart (most of its minute or two) stay as they are
QUICK = {"steps": 3, "kill_after": 1}
QUICK_RECIPE = ["actor.model.tiny.num_steps=2", "algorithm.group_size=2", "env.train.total_num_envs=2",
                "actor.micro_batch_size=2", "actor.global_batch_size=2"]


def train_rows(log_dir: Path) -> list[dict]:
    """The training steps logged so far, in the order written (a restart drops the lines of the steps it computes
    again, docs/metrics.md)."""
    path = log_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [row for row in rows if "env/avg" in row]


def kill_and_watch(log_dir: Path, role: str, kill_after: int, found: dict) -> None:
    """SIGKILL ``role``'s worker half a step after ``global_step_<kill_after>`` is saved; note when, and when the
    first step after that is logged."""
    import ray

    while not any(p.name == f"global_step_{kill_after}" for p in complete_checkpoints(log_dir / "checkpoints")):
        time.sleep(0.02)
    found["step_s"] = statistics.median(row["time/step"] for row in train_rows(log_dir))
    time.sleep(found["step_s"] / 2)
    alive = [a for a in ray._private.state.actors().values()
             if a["State"] == "ALIVE" and a["Name"].startswith(f"rlrunner-{role}-")]
    logged = train_rows(log_dir)
    os.kill(alive[0]["Pid"], signal.SIGKILL)
    found["killed"] = time.monotonic()
    while all(row in logged for row in train_rows(log_dir)):  # a new line, not one fewer after the restart
        time.sleep(0.02)
    found["next_step"] = time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=("actor", "rollout", "env"), default="actor", help="the worker killed")
    parser.add_argument("--steps", type=int, default=4, help="runner.max_steps")
    parser.add_argument("--kill-after", type=int, default=2, help="kill during the step after this one's checkpoint")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, key=value")
    parser.add_argument("--quick", action="store_true",
                        help=f"tiny sizes ({QUICK}, {' '.join(QUICK_RECIPE)}; options and overrides given still "
                             "apply): checks the script runs")
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(**QUICK)
        args = parser.parse_args()
    if not 1 <= args.kill_after < args.steps:
        parser.error(f"--kill-after must be in 1..{args.steps - 1} (--steps {args.steps}), got {args.kill_after}")
    quick = QUICK_RECIPE if args.quick else []
    cfg = load_recipe("tiny_nft_ocr", [*RECIPE, *quick, f"runner.max_steps={args.steps}", *args.overrides])
    with tempfile.TemporaryDirectory() as root:
        log_dir = Path(root) / "run"
        log_dir.mkdir()
        found: dict = {}
        watcher = threading.Thread(target=kill_and_watch, args=(log_dir, args.role, args.kill_after, found),
                                   daemon=True)
        watcher.start()
        run(cfg, log_dir)
        watcher.join(timeout=60)
        (restart,) = [json.loads(line) for line in (log_dir / "restarts.jsonl").read_text().splitlines()]
    total = found["next_step"] - found["killed"]
    print(f"killed: {restart['worker']}")
    print(f"death -> first step after recovery: {total:.1f} s (restart: {restart['seconds']:.1f} s; noticing the "
          f"death and the step itself: {total - restart['seconds']:.1f} s)")
    print(f"steps lost: {restart['lost_steps']} finished, plus step {restart['step_failed_at']} in progress "
          f"(resumed from global_step_{restart['step_resumed_from']})")
    print(f"step: {found['step_s']:.2f} s (median before the kill)")


if __name__ == "__main__":
    main()
