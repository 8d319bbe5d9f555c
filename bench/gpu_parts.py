"""One part of the device check (bench/gpu_check.sh runs each in its own process): its rows as JSON.

    python bench/gpu_parts.py sd3 --models DIR --out DIR [--tiny]     # rollout + NFT training throughput
    python bench/gpu_parts.py runner --models DIR --out DIR [--tiny]  # sd3_nft_ocr through the launcher + resume

Parts: ``sd3`` and ``wan`` load the recipe's model (sd3_nft_ocr; wan22_ti2v_5b_nft_ocr and its video recipe) from
the folder under --models and time a group of training rollouts (the recipe's sampler and steps, EMA adapter,
VAE decode) and NFT optimizer steps (the recipe's objective, micro-batches with accumulation, AdamW, clip, EMA).
``runner`` and ``qwen`` launch sd3_nft_ocr / qwen_image_nft_ocr with examples/diffusion/run_diffusion.sh for two
steps (eval and checkpoint at step 2), then launch again resuming from that checkpoint to step 3, and check the
checkpoint, the eval and the resume. A part writes <out>/<part>.json: rows of images, images/GPU/s, s/step,
peak memory (device on a GPU, host RSS on CPU), a status, and for the launched runs the per-device peak that
``bin/rlrunner plan --simulate`` predicts for the same recipe and overrides (the first GPU run tests the simulator).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LAUNCHER = ROOT / "examples" / "diffusion" / "run_diffusion.sh"
PROMPTS = ['a sign that says "open"', 'a poster with the word "rlrunner"', 'a mug printed with "hello"',
           'a street sign reading "main st"', 'a neon sign that says "diffusion"', 'a book titled "flow"',
           'a label that reads "2026"', 'a banner saying "gpu check"']


@dataclass(frozen=True)
class Profile:
    """What differs between the device check and its --tiny rehearsal on CPU: sizes, nothing else."""

    family: dict[str, dict[str, Any]] = field(default_factory=dict)  # actor.model.<family> overrides
    rollout_batch: int | None = None  # images per timed rollout (None: the recipe's group_size)
    micro_batch: int | None = None  # samples per forward/backward (None: the recipe's actor.micro_batch_size)
    accum: int = 4  # micro-batches per timed optimizer step
    repeats: int = 2  # timed calls after one warm-up
    run: dict[str, int] = field(default_factory=dict)  # runner parts: group_size, envs, eval_envs, micro, eval_steps


def _tiny_family() -> dict[str, dict[str, Any]]:
    """The model tests' settings of the tiny pipelines; num_frames stays the recipe's (image or video)."""
    from gpu_folders import tiny_pipelines

    small = {"lora_rank": 4, "lora_alpha": 8, "num_steps": 2}
    return {family: {**{k: v for k, v in settings.items() if k != "num_frames"}, **small}
            for family, settings in tiny_pipelines().TINY_FAMILY_SETTINGS.items()}


PROFILES: dict[str, Callable[[], Profile]] = {
    "full": lambda: Profile(run={"group_size": 8, "envs": 16, "eval_envs": 8, "micro": 4, "eval_steps": 10}),
    "tiny": lambda: Profile(family=_tiny_family(), rollout_batch=4, micro_batch=2, accum=2, repeats=1,
                            run={"group_size": 4, "envs": 8, "eval_envs": 2, "micro": 2, "eval_steps": 2}),
}


# ------------------------------------------------------------------------------------------------ helpers
def write_prompts(folder: Path) -> Path:
    """A prompt dataset (train.txt / test.txt) of quoted texts: the runs need no shipped dataset."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        (folder / f"{split}.txt").write_text("\n".join(PROMPTS) + "\n")
    return folder


def model_overrides(folder: Path, profile: Profile, prompts: Path, **family: Any) -> list[str]:
    """Recipe overrides that point a recipe at ``folder`` and ``prompts``, with the profile's family sizes and
    ``family`` (``actor.model.<model_type>`` keys) on top."""
    from rlrunner.models import detect_model_type

    model_type = detect_model_type(str(folder))  # the pipeline class and, for Wan, which layout
    values = {**profile.family.get(model_type, {}), **family}
    return [f"actor.model.model_path={folder}", f"env.train.dataset.path={prompts}",
            f"env.eval.dataset.path={prompts}", *(f"actor.model.{model_type}.{k}={json.dumps(v)}"
                                                  for k, v in values.items())]


def accelerator(device: Any) -> Any:
    import torch

    return getattr(torch, device.type) if device.type != "cpu" else None


def timed(fn: Callable[[], Any], device: Any, repeats: int) -> tuple[float, Any]:
    """Median seconds of ``repeats`` calls after one warm-up call, and the last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        if accelerator(device):
            accelerator(device).synchronize()
        start = time.perf_counter()
        out = fn()
        if accelerator(device):
            accelerator(device).synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def row(part: str, gpus: int, images: int, seconds: float | None, peak: float | None, status: str = "ok",
        **detail: Any) -> dict[str, Any]:
    rate = None if not seconds else images / seconds / max(1, gpus)
    return {"part": part, "gpus": gpus, "images": images, "images_per_gpu_s": rate, "s_per_step": seconds,
            "peak_gib": peak, "status": status, **detail}


# ------------------------------------------------------------------------------------ throughput parts
def measure_recipe(recipe: str, folder: Path, profile: Profile, label: str, workdir: Path) -> list[dict[str, Any]]:
    """A group of training rollouts and NFT optimizer steps of ``recipe``'s model, timed in this process."""
    import torch

    from rlrunner.algorithms.ema import ema_update_
    from rlrunner.cluster.parallelize import Engine
    from rlrunner.models import EMA_ADAPTER, TRAINED_ADAPTER, build_model
    from rlrunner.objectives import MicroBatch, build_objective
    from rlrunner.recipe import load_recipe

    cfg = load_recipe(recipe, model_overrides(folder, profile, write_prompts(workdir / "prompts")))
    family = cfg.actor.model[cfg.actor.model.model_type]
    torch.manual_seed(0)
    start = time.perf_counter()
    model = build_model(cfg.actor.model)
    device = model.device
    print(f"gpu_parts: {label}: {recipe}'s model loaded on {device} in {time.perf_counter() - start:.0f}s", flush=True)
    if accelerator(device):
        accelerator(device).reset_peak_memory_stats()
    objective = build_objective(cfg.algorithm, family)
    batch = profile.rollout_batch or int(cfg.algorithm.group_size)
    cond = model.repeat_cond(model.encode_prompts(PROMPTS[:1]), batch)
    gen = torch.Generator(device).manual_seed(0)
    noise = torch.randn((batch, *model.latent_shape), generator=gen, device=device)

    def rollout() -> torch.Tensor:
        x0, _ = objective.rollout(model, cond, noise, gen)
        model.decode(x0)
        return x0

    t_roll, x0 = timed(rollout, device, profile.repeats)
    if not torch.isfinite(x0).all():
        raise FloatingPointError(f"{label}: the rollout gave non-finite latents")
    print(f"gpu_parts: {label}: rollout of {batch} in {t_roll:.2f}s", flush=True)
    micro = min(batch, profile.micro_batch or int(cfg.actor.micro_batch_size))
    x0 = x0[:micro].float().cpu()  # the actor's micro-batches come from host memory
    advantages = torch.linspace(-1, 1, micro)
    if cfg.algorithm.adv_type == "grpo_video":  # one advantage per latent frame, as the video recipe trains
        advantages = advantages[:, None].repeat(1, model.latent_shape[1])
    engine, params = Engine(model), model.trainable_parameters()
    optimizer = torch.optim.AdamW(params, lr=float(cfg.actor.optim.lr), weight_decay=1e-4)
    micro_cond = {k: v[:micro] for k, v in cond.items()}

    def optimizer_step() -> float:
        losses = []
        for k in range(profile.accum):
            generators = [torch.Generator().manual_seed(k * micro + i) for i in range(micro)]
            tensors = {"x0": x0, "advantages": advantages, "sample_index": torch.arange(micro)}
            loss, _ = objective.loss(model, engine, MicroBatch(tensors, micro_cond, generators, draw=0))
            (loss / profile.accum).backward()
            losses.append(float(loss.detach()))
        engine.clip_grad_norm(params, float(cfg.actor.optim.clip_grad))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ema_update_(model.adapter_parameters(EMA_ADAPTER), model.adapter_parameters(TRAINED_ADAPTER), tau=0.01)
        return statistics.mean(losses)

    t_train, loss = timed(optimizer_step, device, profile.repeats)
    if not torch.isfinite(torch.tensor(loss)):
        raise FloatingPointError(f"{label}: non-finite NFT loss {loss}")
    print(f"gpu_parts: {label}: NFT step of {profile.accum} x {micro} in {t_train:.2f}s", flush=True)
    if accelerator(device):
        peak = accelerator(device).max_memory_allocated(device) / 2**30
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    pixels = "x".join(map(str, model.shapes.pixels[:-1]))
    steps = f"{family.num_steps}-step {family.train_sampler}"
    return [row(f"{label} rollout ({steps}, {pixels} px, + decode)", 1, batch, t_roll, peak),
            row(f"{label} NFT step ({profile.accum} x {micro})", 1, profile.accum * micro, t_train, peak,
                loss=loss)]


# -------------------------------------------------------------------------------------------- runner parts
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


def run_process(command: list[str], log: Path, timeout: float, env: dict[str, str] | None = None,
                echo: str = "gpu_") -> tuple[int | None, str]:
    """Run ``command`` in its own session with its output in ``log``, echoing lines that start with ``echo``.

    Past ``timeout`` seconds the whole session is killed (a launcher with its Python and Ray processes, or a
    collective that hangs). Returns the exit status (None after a timeout) and the last error-looking line.
    """
    import signal

    start, shown = time.monotonic(), 0
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        while proc.poll() is None and time.monotonic() - start < timeout:
            time.sleep(1.0)
            lines = log.read_text(errors="replace").splitlines()
            for line in lines[shown:]:
                if line.startswith(echo):
                    print("  " + line, flush=True)
            shown = len(lines)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None, f"timed out after {timeout:.0f}s (see {log})"
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln] or lines or ["no output"]
    return proc.returncode, f"{errors[-1][:300]} (see {log})"


def launch(recipe: str, overrides: list[str], log_root: Path, timeout: float) -> Path:
    """Run ``recipe`` through the launcher with ``overrides``; its log dir. Raises with the error on failure."""
    log_root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHON": sys.executable, "RLRUNNER_LOG_ROOT": str(log_root)}
    print(f"gpu_parts: launching {recipe} {' '.join(overrides[-2:])}", flush=True)
    status, error = run_process(["bash", str(LAUNCHER), recipe, *overrides], log_root / "launch.log", timeout, env,
                                echo="rlrunner: ")
    runs = sorted(log_root.glob(f"*-{recipe}"))
    if status != 0 or not runs:
        raise RuntimeError(f"{recipe} {'exited ' + str(status) if status is not None else 'timed out'}: {error}")
    return runs[-1]


SIMULATE_TIMEOUT_S = 240  # a one-device simulation of a check's folder: about a minute on 2 CPU cores


def simulated_peak(recipe: str, overrides: list[str], log: Path, timeout: float) -> float | None:
    """The largest per-device peak (GiB) that ``bin/rlrunner plan --simulate`` predicts for the launch of ``recipe``
    with ``overrides`` (fake tensors on the CPU: the simulator's own check on a GPU); None if it could not run."""
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


def run_recipe(recipe: str, folder: Path, profile: Profile, workdir: Path, gpus: int,
               timeout: float) -> list[dict[str, Any]]:
    """``recipe`` for 2 steps (eval + checkpoint at step 2), then resumed from that checkpoint to step 3; each
    launch may take ``timeout`` seconds."""
    import torch

    from rlrunner.recipe import load_recipe
    from rlrunner.run.checkpoint import complete_checkpoints

    run = profile.run
    prompts = write_prompts(workdir / "prompts")
    overrides = [*model_overrides(folder, profile, prompts, eval_num_steps=run["eval_steps"]),
                 "env.train.reward.engine=rapidocr", "env.eval.reward.engine=rapidocr",  # offline, on the CPU
                 "env.train.reward.use_gpu=false", "env.eval.reward.use_gpu=false",
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
    rows = [row(f"{label}: 2 steps, eval + save at 2", gpus, run["envs"], done.get(2, {}).get("time/step"),
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
    rows.append(row(f"{label}: resume from step 2 to 3", gpus, run["envs"], after.get(3, {}).get("time/step"),
                    memory.peak, "; ".join(problems) or "ok"))
    # after the launches, so that a slow simulation cannot cost the measured rows their time
    predicted = simulated_peak(recipe, [*overrides, f"cluster.num_devices_per_node={gpus}"],
                               workdir / "simulate.log", min(timeout, SIMULATE_TIMEOUT_S))
    return [{**r, "simulated_gib": predicted} for r in rows]


@dataclass(frozen=True)
class Context:
    models: Path  # the model folders (bench/gpu_folders.py)
    profile: Profile
    workdir: Path  # this part's runs and prompts
    gpus: int  # devices of the runner parts
    timeout: float  # seconds of the whole part


#: part -> its steps (name, context -> rows); a step that raises becomes a FAILED row and the next one runs
PARTS: dict[str, list[tuple[str, Callable[[Context], list[dict[str, Any]]]]]] = {
    "sd3": [("sd3.5-m", lambda c: measure_recipe("sd3_nft_ocr", c.models / "sd3", c.profile, "sd3.5-m", c.workdir))],
    "runner": [("sd3_nft_ocr", lambda c: run_recipe("sd3_nft_ocr", c.models / "sd3", c.profile, c.workdir, c.gpus,
                                                      c.timeout / 2))],
    "qwen": [("qwen_image_nft_ocr", lambda c: run_recipe("qwen_image_nft_ocr", c.models / "qwen_image", c.profile,
                                                          c.workdir, c.gpus, c.timeout / 2))],
    "wan": [
        ("wan2.2 image", lambda c: measure_recipe("wan22_ti2v_5b_nft_ocr", c.models / "wan22_ti2v_5b", c.profile,
                                                  "wan2.2 image", c.workdir)),
        ("wan2.2 video", lambda c: measure_recipe("wan22_ti2v_5b_nft_video_ocr", c.models / "wan22_ti2v_5b",
                                                  c.profile, "wan2.2 video", c.workdir)),
    ],
}


def run_steps(part: str, context: Context) -> list[dict[str, Any]]:
    """The rows of ``part``'s steps; a step that raises gives one FAILED row and the next step still runs."""
    import gc
    import traceback

    import torch

    rows = []
    for name, step in PARTS[part]:
        try:
            rows += step(context)
        except Exception as err:  # noqa: BLE001  the table records any failure; the check goes on
            traceback.print_exc()
            rows.append(row(name, 1, 0, None, None, f"FAILED: {type(err).__name__}: {str(err)[:400]}"))
        gc.collect()  # the step's model, before the next one loads
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one part of the device check (bench/gpu_check.sh)")
    parser.add_argument("part", choices=list(PARTS))
    parser.add_argument("--models", type=Path, required=True, help="folder of the model folders (gpu_folders.py)")
    parser.add_argument("--out", type=Path, required=True, help="writes <out>/<part>.json and the part's runs")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes on CPU")
    parser.add_argument("--gpus", type=int, default=1, help="devices of the runner parts")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds of the part (a launch: half of it)")
    args = parser.parse_args(argv)
    workdir = args.out / args.part
    workdir.mkdir(parents=True, exist_ok=True)
    context = Context(args.models, PROFILES["tiny" if args.tiny else "full"](), workdir, args.gpus, args.timeout)
    rows = run_steps(args.part, context)
    (args.out / f"{args.part}.json").write_text(json.dumps(rows, indent=2))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.path.insert(1, str(ROOT / "bench"))
    sys.exit(main())
