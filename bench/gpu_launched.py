"""The device check's commands run in their own sessions, and its launched parts: a recipe through the launcher.

    python bench/gpu_launched.py sd3_nft_ocr --workdir /tmp/run actor.model.model_path=/models/sd3 [key=value ...]

``runner`` and ``qwen`` (bench/gpu_check.sh ``--parts runner,qwen``; any recipe and folder from this command line)
launch sd3_nft_ocr / qwen_image_nft_ocr with
examples/diffusion/run_diffusion.sh for two steps (eval and checkpoint at step 2), then launch again resuming from
that checkpoint to step 3, and check the checkpoint, the eval and the resume. They run in-process workers
(``cluster.backend=local``, no Ray) unless ``--backend ray``. Their peak is the device memory nvidia-smi reports in use
(host RSS on CPU), beside the per-device peak ``bin/rlrunner plan --simulate`` predicts for the same settings: two
different quantities (bench/gpu_parts.py compares the same one, phase by phase).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "examples" / "diffusion" / "run_diffusion.sh"
PROMPTS = ['a sign that says "open"', 'a poster with the word "rlrunner"', 'a mug printed with "hello"',
           'a street sign reading "main st"', 'a neon sign that says "diffusion"', 'a book titled "flow"',
           'a label that reads "2026"', 'a banner saying "gpu check"']
SIMULATE_TIMEOUT_S = 240  # a one-device simulation of a check's folder: about a minute on 2 CPU cores
#: the device check's launched parts: recipe and model folder (bench/gpu_folders.py family)
LAUNCHED = {"runner": ("sd3_nft_ocr", "sd3"), "qwen": ("qwen_image_nft_ocr", "qwen_image")}
#: their runs' sizes: samples per prompt and per step, held-out prompts, micro-batch, eval sampler steps
LAUNCHED_RUN = {"full": {"group_size": 8, "envs": 16, "eval_envs": 8, "micro": 4, "eval_steps": 10},
                "tiny": {"group_size": 4, "envs": 8, "eval_envs": 2, "micro": 2, "eval_steps": 2}}


def run_process(command: list[str], log: Path, timeout: float, env: dict[str, str] | None = None,
                echo: str = "gpu_") -> tuple[int | None, str]:
    """Run ``command`` in its own session, its output appended to ``log``, echoing lines that start with ``echo``.

    Past ``timeout`` seconds the whole session is killed (a launcher with its Python processes, or a collective that
    hangs). Returns the exit status (None after a timeout) and the last error-looking line of its output.
    """
    start = time.monotonic()
    offset = log.stat().st_size if log.is_file() else 0
    shown = 0

    def own_lines() -> list[str]:
        with log.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace").splitlines()

    with log.open("a") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        while proc.poll() is None and time.monotonic() - start < timeout:
            time.sleep(1.0)
            lines = own_lines()
            for line in lines[shown:]:
                if line.startswith(echo):
                    print("  " + line, flush=True)
            shown = len(lines)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None, f"timed out after {timeout:.0f}s (see {log})"
    lines = [ln.strip() for ln in own_lines() if ln.strip()]
    for line in lines[shown:]:
        if line.startswith(echo):
            print("  " + line, flush=True)
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln] or lines or ["no output"]
    return proc.returncode, f"{errors[-1][:300]} (see {log})"


def write_atomically(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary name: a run killed meanwhile leaves the previous version whole."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


class PeakMemory:
    """Peak memory while a block runs: used memory of the GPUs (nvidia-smi) or RSS of this process tree (psutil)."""

    peak: float | None

    def __init__(self, gpu: bool) -> None:
        self.gpu, self.peak, self._stop = gpu, None, threading.Event()  # None: no poll succeeded (no nvidia-smi)
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _used_gib(self) -> float:
        if self.gpu:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, check=False).stdout
            return sum(float(v) for v in out.split()) / 1024  # MiB per GPU
        import psutil

        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
        return sum(p.memory_info().rss for p in procs if p.is_running()) / 2**30

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            # a process that exits mid-read fails one poll; the next one counts the others
            with contextlib.suppress(Exception):
                self.peak = max(self.peak or 0.0, self._used_gib())

    def __enter__(self) -> PeakMemory:  # noqa: PYI034  (a final class)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def write_prompts(folder: Path) -> Path:
    """A prompt dataset (train.txt / test.txt) of quoted texts: the runs need no shipped dataset."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        (folder / f"{split}.txt").write_text("\n".join(PROMPTS) + "\n")
    return folder


def launch(recipe: str, overrides: list[str], log_root: Path, timeout: float) -> Path:
    """Run ``recipe`` through the launcher with ``overrides``; its log dir. Raises with the error on failure, after
    printing the end of the launch's output (which lives in the scratch folder, not in the results)."""
    log_root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHON": sys.executable, "RLRUNNER_LOG_ROOT": str(log_root)}
    print(f"gpu_parts: launching {recipe} {' '.join(overrides[-2:])}", flush=True)
    log = log_root / "launch.log"
    status, error = run_process(["bash", str(LAUNCHER), recipe, *overrides], log, timeout, env, echo="rlrunner: ")
    runs = sorted(log_root.glob(f"*-{recipe}"))
    if status != 0 or not runs:
        print("\n".join(log.read_text(errors="replace").splitlines()[-40:]), flush=True)
        raise RuntimeError(f"{recipe} {'exited ' + str(status) if status is not None else 'timed out'}: {error}")
    return runs[-1]


def simulated_peak(recipe: str, overrides: list[str], log: Path, timeout: float) -> float | None:
    """The largest per-device peak (GiB) that ``bin/rlrunner plan --simulate`` predicts for the launch of ``recipe``
    with ``overrides`` (fake tensors on the CPU); None if it could not run."""
    command = [sys.executable, "-m", "rlrunner.commands.plan", recipe, *overrides, "--simulate", "--json"]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:  # the measured rows stand without a prediction
        print(f"gpu_parts: {recipe}: no simulation (over {timeout:.0f}s)", flush=True)
        return None
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        print(f"gpu_parts: {recipe}: no simulation ({done.stderr.strip().splitlines()[-1:]}; see {log})", flush=True)
        return None
    return max(device["peak_gib"] for device in json.loads(done.stdout)["devices"])


def metrics(log_dir: Path) -> dict[int, dict[str, float]]:
    """step -> that step's metrics (train and eval lines merged)."""
    by_step: dict[int, dict[str, float]] = {}
    for line in (log_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step.setdefault(int(record["step"]), {}).update(record)
    return by_step


def run_recipe(recipe: str, family_overrides: list[str], run: dict[str, int], workdir: Path, gpus: int, backend: str,
               timeout: float) -> list[dict[str, Any]]:
    """``recipe`` (with ``family_overrides``: its model folder and sizes) for 2 steps (eval + checkpoint at step 2),
    then resumed from that checkpoint to step 3; each launch may take ``timeout`` seconds. ``run``: group_size,
    envs, eval_envs, micro, eval_steps."""
    import torch

    from rlrunner.recipe import load_recipe
    from rlrunner.run.checkpoint import complete_checkpoints

    prompts = write_prompts(workdir / "prompts")
    overrides = [*family_overrides, f"env.train.dataset.path={prompts}", f"env.eval.dataset.path={prompts}",
                 f"cluster.backend={backend}", "env.train.reward.engine=rapidocr", "env.eval.reward.engine=rapidocr",
                 "env.train.reward.use_gpu=false", "env.eval.reward.use_gpu=false",  # offline, on the CPU
                 f"algorithm.group_size={run['group_size']}", f"env.train.total_num_envs={run['envs']}",
                 "env.train.rollout_epoch=1", f"env.eval.total_num_envs={run['eval_envs']}",
                 f"actor.global_batch_size={run['envs']}", f"actor.micro_batch_size={run['micro']}",
                 "runner.val_before_train=false", "runner.val_check_interval=2", "runner.save_interval=2"]
    gpu = torch.cuda.is_available()
    if gpu:
        overrides.append(f"cluster.num_devices_per_node={gpus}")
    cfg = load_recipe(recipe, overrides)  # a recipe error shows here, before any launch
    ranks = f"{cfg.actor.strategy} over {gpus} rank{'s' if gpus > 1 else ''}"
    if cfg.actor.strategy == "fsdp2" and gpus == 1:  # one rank still shards: DTensors over a one-rank mesh
        overrides.append("actor.one_rank_group=true")
        ranks = "fsdp2 over a one-rank mesh"
    label = f"{recipe} ({ranks}{', offload' if cfg.cluster.enable_offload else ''})"
    with PeakMemory(gpu) as memory:
        first = launch(recipe, [*overrides, "runner.max_steps=2"], workdir / "first", timeout)
    done = metrics(first)
    saved = [p.name for p in complete_checkpoints(first / "checkpoints")]
    problems = []
    if "eval/avg" not in done.get(2, {}):
        problems.append(f"no eval/avg at step 2 (step 2 logged {sorted(done.get(2, {}))})")
    if "global_step_2" not in saved:
        problems.append(f"no complete checkpoint global_step_2 (found {saved})")
    rows = [launched_row(f"{label}: 2 steps, eval + save at 2", gpus, run["envs"], done.get(2, {}).get("time/step"),
                         memory.peak, "; ".join(problems) or "ok", eval_s=done.get(2, {}).get("time/eval"))]
    with PeakMemory(gpu) as memory:
        resumed = launch(recipe, [*overrides, "runner.max_steps=3", f"runner.resume_dir={first}"],
                         workdir / "resume", timeout)
    after = metrics(resumed)
    console = (resumed / "console.log").read_text()
    problems = []
    if "resumed from" not in console or "global_step_2" not in console:
        problems.append("its console.log does not say 'resumed from .../global_step_2'")
    if sorted(k for k in after if k > 0) != [3]:
        problems.append(f"steps logged after the resume: {sorted(after)} (expected step 3 only)")
    rows.append(launched_row(f"{label}: resume from step 2 to 3", gpus, run["envs"], after.get(3, {}).get("time/step"),
                             memory.peak, "; ".join(problems) or "ok"))
    # after the launches, so that a slow simulation cannot cost the measured rows their time
    predicted = simulated_peak(recipe, [*overrides, f"cluster.num_devices_per_node={gpus}"], workdir / "simulate.log",
                               min(timeout, SIMULATE_TIMEOUT_S))
    return [{**r, "simulated_gib": predicted} for r in rows]


def launched_row(part: str, gpus: int, images: int, seconds: float | None, peak: float | None, status: str,
                 **detail: Any) -> dict[str, Any]:
    rate = None if not seconds else images / seconds / max(1, gpus)
    return {"part": part, "gpus": gpus, "images": images, "images_per_gpu_s": rate, "s_per_step": seconds,
            "peak_gib": peak, "status": status, **detail}


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="a recipe through the launcher for 2 steps (eval + save), then "
                                                 "resumed to step 3; prints the rows as JSON")
    parser.add_argument("recipe", help="recipe name (examples/diffusion/config/) or .yaml path")
    parser.add_argument("overrides", nargs="*", help="key=value overrides: the model folder, its sizes")
    parser.add_argument("--workdir", type=Path, required=True, help="the runs' folders and prompts")
    parser.add_argument("--gpus", type=int, default=1, help="devices (over 1: --backend ray)")
    parser.add_argument("--backend", default="local", choices=("local", "ray"), help="cluster.backend of the runs")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per launch")
    args = parser.parse_intermixed_args(argv)
    rows = run_recipe(args.recipe, args.overrides, LAUNCHED_RUN["full"], args.workdir, args.gpus, args.backend,
                      args.timeout)
    print(json.dumps(rows, indent=2))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
