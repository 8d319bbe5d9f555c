"""One part of the device check, in its own process (bench/gpu_check.py runs each): its rows as JSON.

    python bench/gpu_parts.py ddp --models DIR --out DIR --scratch DIR [--prepared DIR] [--tiny]

``ddp``, ``fsdp2`` (sd3_nft_ocr) and ``wan`` (wan22_ti2v_5b_nft_video_ocr) build the real ActorWorker and
RolloutWorker in this process, collocated on one device with ``cluster.enable_offload`` (the actor over a process
group of one rank: NCCL on a GPU, gloo on CPU), and go through one step's phases in the runner's order:
actor_load, rollout_load, (actor to host) rollout x2 (cold, then timed), decode, the OCR reward on the CPU,
(rollout to host, actor back) update x2 (cold, then timed), ema, weight_sync, and the offload round trip back. Each
phase's seconds and, on a GPU, its peak of ``torch.cuda.max_memory_allocated`` (the tensors held, as
``bin/rlrunner plan --simulate`` counts them) stand beside the simulation of the same settings that
bench/gpu_prepare.py computed beforehand (``--prepared``); model FLOP utilisation divides the simulation's FLOPs
(gradient checkpointing's recompute included, as plan's step prediction counts them) by the measured seconds.
``runner`` and ``qwen`` are launched runs (bench/gpu_launched.py). A part rewrites <out>/<part>.json after each of
its steps, so that a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "bench"))
# bench/ is not a package: its modules import each other by path
from gpu_launched import LAUNCHED, LAUNCHED_RUN, run_recipe, write_atomically

GIB = 2**30
PROMPTS = ['a sign that says "open"', 'a poster with the word "rlrunner"', 'a mug printed with "hello"']
#: images the OCR reward scores per part (a video: its frames count): the engine's speed, not the whole batch's
OCR_IMAGES = 8
#: phases in the runner's order (rlrunner/sizing/sim_report.py PHASE_ORDER): measured here, simulated there
PHASES = ("actor_load", "rollout_load", "rollout", "decode", "update", "ema", "weight_sync")


@dataclass(frozen=True)
class Batches:
    """A step of two prompts, one rollout call per prompt (the runner's two rounds); the update trains 3 micro-batches
    of the step, as the simulation does (rlrunner.sizing.simulate.actor_samples)."""

    group_size: int  # samples of one rollout call
    micro: int  # actor.micro_batch_size


@dataclass(frozen=True)
class Part:
    recipe: str
    family: str  # its model folder under --models (bench/gpu_folders.py)
    strategy: str  # actor.strategy, over a process group of one rank
    label: str


PARTS = {
    "ddp": Part("sd3_nft_ocr", "sd3", "ddp", "sd3.5-m ddp"),
    "fsdp2": Part("sd3_nft_ocr", "sd3", "fsdp2", "sd3.5-m fsdp2"),
    "wan": Part("wan22_ti2v_5b_nft_video_ocr", "wan22_ti2v_5b", "ddp", "wan2.2-5b video ddp"),
}
#: the recipes' own group per rollout call; micro-batch 8 for SD3 (its 9 divides no one-device step of 2 groups of 24)
BATCHES = {"full": {"sd3_nft_ocr": Batches(24, 8), "wan22_ti2v_5b_nft_video_ocr": Batches(8, 4)},
           "tiny": {"sd3_nft_ocr": Batches(4, 2), "wan22_ti2v_5b_nft_video_ocr": Batches(4, 2)}}


def tiny_family(model_type: str) -> dict[str, Any]:
    """The model tests' settings of the tiny pipelines (tests/helpers/tiny_pipelines.py); num_frames stays the recipe's."""
    from gpu_folders import tiny_pipelines

    settings = tiny_pipelines().TINY_FAMILY_SETTINGS[model_type]
    kept = {k: v for k, v in settings.items() if k != "num_frames"}
    return {**kept, "lora_rank": 4, "lora_alpha": 8, "num_steps": 2}


def family_overrides(folder: Path, tiny: bool, **family: Any) -> list[str]:
    """Overrides that point a recipe at ``folder`` with the tiny sizes (``tiny``) and ``family`` on top."""
    from rlrunner.models import detect_model_type

    model_type = detect_model_type(str(folder))  # the pipeline class and, for Wan, which layout
    values = {**(tiny_family(model_type) if tiny else {}), **family}
    return [f"actor.model.model_path={folder}",
            *(f"actor.model.{model_type}.{k}={json.dumps(v)}" for k, v in values.items())]


def part_overrides(part: str, folder: Path, tiny: bool) -> list[str]:
    """The recipe overrides of in-process ``part`` with its model at ``folder``: what bench/gpu_prepare.py simulates
    and this file runs."""
    spec = PARTS[part]
    batches = BATCHES["tiny" if tiny else "full"][spec.recipe]
    envs = 2 * batches.group_size
    return [*family_overrides(folder, tiny), "cluster.backend=local", "cluster.num_devices_per_node=1",
            "cluster.enable_offload=true", f"actor.strategy={spec.strategy}", "actor.one_rank_group=true",
            f"algorithm.group_size={batches.group_size}", f"env.train.total_num_envs={envs}",
            "env.train.rollout_epoch=1", "runner.async_reward=true", f"actor.global_batch_size={envs}",
            f"actor.micro_batch_size={batches.micro}",
            *(f"env.{split}.reward.{key}" for split in ("train", "eval")
              for key in ("engine=rapidocr", "use_gpu=false"))]


def step_counts(cfg: Any) -> tuple[Any, Any, int, int]:
    """(placement, geometry, samples this rank trains in a step, samples the simulated update trains), as
    ``bin/rlrunner plan`` derives them from ``cfg``."""
    from rlrunner.cluster.placement import parse_placement
    from rlrunner.cluster.resources import detect_devices_per_node
    from rlrunner.sizing.memory import model_sizes, step_geometry
    from rlrunner.sizing.simulate import actor_samples

    sizes = model_sizes(cfg.actor.model, Path(cfg.actor.model.model_path))
    placement = parse_placement(cfg.cluster.component_placement, cfg.cluster.num_nodes,
                                detect_devices_per_node(cfg.cluster))
    geometry = step_geometry(cfg, placement, sizes.guidance)
    return (placement, geometry, *actor_samples(cfg, geometry))


def gpu_peak_flops(name: str) -> float | None:
    """The dense bf16 peak (FLOP/s) of the GPU named ``name`` (plan's table), None if unknown."""
    from rlrunner.sizing.sim_report import GPU_PEAK_TFLOPS

    found = [key for key in sorted(GPU_PEAK_TFLOPS, key=len, reverse=True) if key in name.lower()]
    return GPU_PEAK_TFLOPS[found[0]] * 1e12 if found else None


class Phases:
    """Seconds of each call of a phase and, on an accelerator, its peak allocated bytes and the bytes held at its
    start (on CPU the peak is the process's peak RSS: host memory, another quantity), beside the simulation's
    per-device peak and activations of the same phase (``simulated``: the prepared simulated.json's entry)."""

    def __init__(self, device: Any, simulated: dict[str, Any] | None, records: dict[str, dict[str, Any]]) -> None:
        import torch

        self.accelerator = getattr(torch, device.type) if device.type != "cpu" else None
        self.simulated = simulated or {}
        self.records = records  # phase -> its record, updated as each call ends

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        acc = self.accelerator
        if acc:
            acc.synchronize()
            acc.reset_peak_memory_stats()
        start_bytes = acc.memory_allocated() if acc else None
        start = time.perf_counter()
        yield
        if acc:
            acc.synchronize()
        record = self.records.setdefault(name, {
            "seconds": [], "peak_gib": None, "start_gib": None, "simulated_gib": self._simulated("phase_bytes", name),
            "simulated_activations_gib": self._simulated("activation_bytes", name)})
        record["seconds"].append(time.perf_counter() - start)
        peak = acc.max_memory_allocated() / GIB if acc else host_peak_gib()
        record["peak_gib"] = max(record["peak_gib"] or 0.0, peak)
        if acc:
            record["start_gib"] = min(record["start_gib"] or float("inf"), start_bytes / GIB)

    def _simulated(self, key: str, phase: str) -> float | None:
        nbytes = self.simulated.get(key, {}).get(phase)
        return None if nbytes is None else nbytes / GIB

    def seconds(self, name: str) -> float:
        """The last call's seconds (after a cold first call, the warm one)."""
        return self.records[name]["seconds"][-1]

    def allocated_gib(self) -> float | None:
        return self.accelerator.memory_allocated() / GIB if self.accelerator else None


def host_peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


@dataclass
class Context:
    part: str
    models: Path
    out: Path
    scratch: Path
    tiny: bool
    simulated: dict[str, Any] | None  # this part's entry of the prepared simulated.json
    gpus: int
    backend: str
    timeout: float
    rows: list[dict[str, Any]]
    phases: dict[str, dict[str, Any]]
    peak_flops: float | None = None  # the GPU's dense bf16 FLOP/s, the denominator of MFU

    def emit(self, status: str = "running") -> None:
        """Rewrite <out>/<part>.json with the rows and phases so far."""
        result = {"part": self.part, "status": status, "rows": self.rows, "phases": self.phases}
        write_atomically(self.out / f"{self.part}.json", json.dumps(result, indent=2))


def row(ctx: Context, step: str, phases: tuple[str, ...], seconds: float | None, images: int | None = None,
        flops: float | None = None, status: str = "ok", **detail: Any) -> dict[str, Any]:
    """A table row of ``step`` (label and numbers), its memory the largest of ``phases`` measured and simulated."""
    measured = [ctx.phases[p]["peak_gib"] for p in phases if p in ctx.phases]
    simulated = [ctx.phases[p]["simulated_gib"] for p in phases if ctx.phases.get(p, {}).get("simulated_gib")]
    return {"part": f"{PARTS[ctx.part].label}: {step}", "gpus": 1, "images": images,
            "images_per_gpu_s": images / seconds if images and seconds else None, "s_per_step": seconds,
            "peak_gib": max(measured) if measured else None,
            "simulated_gib": max(simulated) if simulated else None,
            "mfu": flops / seconds / ctx.peak_flops if flops and seconds and ctx.peak_flops else None,
            "status": status, **detail}


def collocated_step(ctx: Context) -> None:
    """The in-process part (module docstring); rows are emitted as its steps finish."""
    import torch
    from omegaconf import OmegaConf

    from rlrunner.recipe import load_recipe
    from rlrunner.rewards import build_reward
    from rlrunner.step.batch import Batch
    from rlrunner.workers.actor import ActorWorker
    from rlrunner.workers.rollout import RolloutWorker

    spec = PARTS[ctx.part]
    cfg = load_recipe(spec.recipe, part_overrides(ctx.part, ctx.models / spec.family, ctx.tiny), check_datasets=False)
    _, geometry, per_rank, n_train = step_counts(cfg)
    family = cfg.actor.model[cfg.actor.model.model_type]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    phases, flops = Phases(device, ctx.simulated, ctx.phases), (ctx.simulated or {}).get("flops", {})
    ctx.peak_flops = gpu_peak_flops(torch.cuda.get_device_name()) if device.type == "cuda" else None
    ranks = f"{spec.strategy} over a one-rank {'nccl' if device.type == 'cuda' else 'gloo'} group"

    def emit(*rows: dict[str, Any]) -> None:
        ctx.rows += rows
        ctx.emit()

    # the actor trains one optimizer step of the simulated samples, as the simulation builds it
    actor_cfg = OmegaConf.merge(cfg.actor, {"global_batch_size": n_train})
    with phases("actor_load"):
        actor = ActorWorker(actor_cfg, cfg.algorithm, 2, rank=0, world_size=1)
    with phases("rollout_load"):
        rollout = RolloutWorker(cfg.actor.model, int(cfg.actor.seed), algorithm_cfg=cfg.algorithm)
    load_s = phases.seconds("actor_load") + phases.seconds("rollout_load")
    emit(row(ctx, f"load actor ({ranks}) + rollout models", ("actor_load", "rollout_load"), load_s))

    start = time.perf_counter()
    actor.offload()  # the runner's DeviceTurns: the other model to host memory, then this one's back
    rollout.onload()
    to_rollout_s = time.perf_counter() - start
    model, n = rollout.model, geometry.samples_per_rollout_call
    prompts = PROMPTS[: max(1, n // geometry.group_size)]
    cond = model.encode_prompts(prompts)
    per_sample = model.repeat_cond(cond, geometry.group_size)
    noise = torch.randn((n, *model.latent_shape), generator=torch.Generator().manual_seed(0)).to(model.device)
    generator = torch.Generator(model.device).manual_seed(0)
    for _ in range(2):  # cold, then timed warm
        with phases("rollout"):
            x0, kept = rollout.objective.rollout(model, per_sample, noise, generator)
    if not torch.isfinite(x0).all():
        raise FloatingPointError(f"{spec.label}: the rollout gave non-finite latents")
    with phases("decode"):
        images = model.decode(x0)
    reward = build_reward(cfg.env.train.reward)
    scored_n = max(1, OCR_IMAGES // (images.shape[1] if images.ndim == 5 else 1))  # a video scores every frame
    start = time.perf_counter()
    scored = reward(images[:scored_n], [p for p in prompts for _ in range(geometry.group_size)][:scored_n])
    reward_s = time.perf_counter() - start
    pixels = "x".join(map(str, model.shapes.pixels[:-1]))
    emit(row(ctx, f"rollout ({n} x {family.num_steps}-step {family.train_sampler}, {pixels} px)", ("rollout",),
             phases.seconds("rollout"), n, flops.get("rollout"), cold_s=ctx.phases["rollout"]["seconds"][0]),
         row(ctx, f"VAE decode ({n})", ("decode",), phases.seconds("decode"), n, flops.get("decode")),
         row(ctx, f"OCR reward ({scored_n} of them, {cfg.env.train.reward.engine} on the CPU)", (), reward_s, scored_n,
             mean_reward=float(scored.avg.mean()), reward_errors=scored.errors))

    start = time.perf_counter()
    rollout.offload()
    actor.onload()
    to_actor_s = time.perf_counter() - start
    train = Batch({"x0": x0.float().cpu(), **{k: v.cpu() for k, v in kept.items()}}, {},
                  {f"cond.{k}": v.cpu() for k, v in cond.items()},
                  torch.arange(len(prompts)).repeat_interleave(geometry.group_size))
    del x0, kept, noise, per_sample, images  # what the runner keeps of a rollout is on the host
    index = torch.arange(n_train)
    train = train.select(index % n)  # the rollout's samples, repeated up to the simulated update's
    advantages = torch.linspace(-1, 1, n_train)
    if cfg.algorithm.adv_type == "grpo_video":  # one advantage per latent frame, as the video recipe trains
        advantages = advantages[:, None].repeat(1, actor.model.latent_shape[1])
    losses = []
    for step in range(2):  # cold (AdamW's state is made), then timed warm
        with phases("update"):
            metrics = actor.update([train], index, index.clone(), advantages, step)
        losses.append(metrics[actor.objective.loss_key])
    if not all(torch.isfinite(torch.tensor(losses))) or metrics.get("nonfinite"):
        raise FloatingPointError(f"{spec.label}: non-finite loss {losses}")
    micro = int(actor_cfg.micro_batch_size)
    emit(row(ctx, f"NFT update ({n_train // micro} x {micro}, {ranks})", ("update",), phases.seconds("update"),
             n_train, flops.get("update"), loss=losses[-1],
             cold_s=ctx.phases["update"]["seconds"][0], per_rank_samples=per_rank))

    with phases("ema"):
        actor.ema_update(1)
    with phases("weight_sync"):
        weights = actor.lora_weights(flat=True)
    rollout.sync_weights(weights)
    held = phases.allocated_gib()
    start = time.perf_counter()
    actor.offload()
    freed = None if held is None else held - phases.allocated_gib()
    rollout.onload()
    back_s = time.perf_counter() - start
    emit(row(ctx, "EMA + weight sync", ("ema", "weight_sync"), phases.seconds("ema") + phases.seconds("weight_sync")),
         row(ctx, "offload round trip (actor out, rollout in; and back)", (), to_rollout_s + to_actor_s + back_s,
             status="ok" if freed is None or freed > 0 else f"offloading the actor freed {freed:.2f} GiB",
             actor_offload_freed_gib=freed))
    if torch.distributed.is_initialized():  # the actor's group of one, closed before the process ends
        torch.distributed.destroy_process_group()


def launched(ctx: Context) -> None:
    """A launched part: its recipe for 2 steps, eval, save and resume (bench/gpu_launched.py)."""
    recipe, folder = LAUNCHED[ctx.part]
    run = LAUNCHED_RUN["tiny" if ctx.tiny else "full"]
    overrides = family_overrides(ctx.models / folder, ctx.tiny, eval_num_steps=run["eval_steps"])
    ctx.rows += run_recipe(recipe, overrides, run, ctx.scratch / ctx.part, ctx.gpus, ctx.backend, ctx.timeout / 2)
    ctx.emit()


RUNNERS: dict[str, Callable[[Context], None]] = {**dict.fromkeys(PARTS, collocated_step),
                                                 **dict.fromkeys(LAUNCHED, launched)}


def prepared_simulation(args: argparse.Namespace) -> dict[str, Any] | None:
    """This part's entry of the prepared simulated.json, if it simulated these settings (else None, said once)."""
    simulated_file = args.prepared / "simulated.json" if args.prepared else None
    if args.part not in PARTS or simulated_file is None or not simulated_file.is_file():
        return None
    entry = json.loads(simulated_file.read_text()).get(args.part)
    own = [o for o in part_overrides(args.part, args.models / PARTS[args.part].family, args.tiny)
           if not o.startswith("actor.model.model_path=")]
    if entry is None or entry["overrides"] != own:
        print(f"gpu_parts: {simulated_file} simulated other settings for {args.part} (prepare again); the phases are "
              f"compared with nothing", flush=True)
        return None
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one part of the device check (bench/gpu_check.sh)")
    parser.add_argument("part", choices=list(RUNNERS))
    parser.add_argument("--models", type=Path, required=True, help="folder of the model folders (gpu_folders.py)")
    parser.add_argument("--out", type=Path, required=True, help="writes <out>/<part>.json")
    parser.add_argument("--scratch", type=Path, required=True, help="the launched runs' folders")
    parser.add_argument("--prepared", type=Path, default=None, help="bench/gpu_prepare.py's folder (simulated.json)")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes on CPU")
    parser.add_argument("--gpus", type=int, default=1, help="devices of the launched parts")
    parser.add_argument("--backend", default="local", choices=("local", "ray"), help="cluster of the launched parts")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds of the part (a launch: half of it)")
    args = parser.parse_args(argv)
    ctx = Context(args.part, args.models, args.out, args.scratch, args.tiny, None, args.gpus, args.backend,
                  args.timeout, [], {})
    try:
        ctx.simulated = prepared_simulation(args)
        RUNNERS[args.part](ctx)
    except Exception as err:  # noqa: BLE001  the table records any failure; the check goes on
        import traceback

        traceback.print_exc()
        ctx.rows.append({"part": f"{PARTS[args.part].label if args.part in PARTS else args.part}", "gpus": 1,
                         "images": None, "images_per_gpu_s": None, "s_per_step": None, "peak_gib": None,
                         "simulated_gib": None, "mfu": None,
                         "status": f"FAILED: {type(err).__name__}: {str(err)[:400]}"})
    failed = any(r["status"] != "ok" for r in ctx.rows)
    ctx.emit("FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
