"""Will it fit? ``bin/rlrunner plan <config_name> [key=value ...] [--device-memory GIB]``.

Loads the recipe as the launcher does (prompt files are not needed), builds every component of the model folder
on the meta device from its config files (``model_index.json`` and each component's ``config.json``; weights
are never read) and prints, per device of ``cluster.component_placement``, what each component holds there
(:mod:`rlrunner.sizing.memory` says what that is), an activation estimate, and the peak against the device's
memory: of the accelerator visible here, or ``--device-memory``; and the CPU threads of a CPU OCR reward per env
worker (:mod:`rlrunner.sizing.threads`), with a warning when they are too few. User errors print one line and
exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from rlrunner.cluster.placement import format_devices, parse_placement
from rlrunner.cluster.resources import detect_devices_per_node
from rlrunner.config.loader import RecipeError, recipe_path
from rlrunner.models.meta import ModelFolderError
from rlrunner.models.shapes import ActivationProfile
from rlrunner.recipe import load_recipe
from rlrunner.sizing.memory import (
    ComponentPlan,
    ModelSizes,
    StepGeometry,
    actor_plan,
    env_plan,
    format_bytes,
    host_buffer_parts,
    model_sizes,
    resolve_model_folder,
    rollout_plan,
    step_geometry,
)
from rlrunner.sizing.sim_report import (
    DEFAULT_MFU,
    GPU_PEAK_TFLOPS,
    device_results,
    recipe_device_gib,
    simulation_json,
    simulation_lines,
    step_prediction,
)
from rlrunner.sizing.simulate import simulate_recipe
from rlrunner.sizing.threads import ocr_thread_lines
from rlrunner.utils.device import npu_available

EXIT_USER_ERROR = 2
RUNNING_COMPONENTS = ("actor", "rollout")  # env holds no counted memory; it never defines a phase
def activation_note(profile: ActivationProfile) -> str:
    """The formula behind the activation lines, with the family's constants (:class:`ActivationProfile`)."""
    tokens = "image tokens / cp + text tokens" if profile.text_in_sequence else "image tokens / cp (text: cross-attention)"
    chunk = f" x {profile.decode_chunk_frames} frames" if profile.decode_chunk_frames > 1 else ""
    return (f"activations: formula estimate in the model dtype, s = {tokens} per sample on a rank (cp = "
            f"context_parallel_size), h = hidden size, L = blocks, with this family's constants (measured by plan "
            f"--simulate): training L*b*s*h + {profile.training:g}*b*s*h with gradient checkpointing "
            f"({profile.training:g}*L*b*s*h without), sampling {profile.sampling:g}*b*s*h, VAE decode "
            f"{profile.decode:g} bytes per pixel{chunk} of a decode call's samples. Not included: the text encoders' "
            f"forward, the CUDA context (~0.5-1 GiB per process), allocator fragmentation; the env's OCR engine is "
            f"not counted.")


@dataclass(frozen=True)
class DeviceMemory:
    name: str
    total_bytes: int


def visible_device_memory() -> DeviceMemory | None:
    """Total memory of this machine's first accelerator (all devices of a placement are taken to be alike)."""
    if torch.cuda.is_available():
        return DeviceMemory(f"cuda:0 {torch.cuda.get_device_name(0)}", torch.cuda.mem_get_info(0)[1])
    if npu_available():
        return DeviceMemory("npu:0", torch.npu.mem_get_info(0)[1])
    return None


def device_peak(plans: dict[str, ComponentPlan], components: tuple[str, ...], *, swap: bool,
                concurrent: bool) -> tuple[int, str]:
    """Peak bytes on a device holding ``components`` and the phase it happens in.

    Collocated components take turns (one phase each): the running one holds everything plus its transient
    tensors and activations; the idle one keeps its persistent parts, minus the swapped ones when ``swap``
    (``cluster.enable_offload``) but at start-up, when every model is loaded and none swapped yet. With
    ``concurrent`` (``runner.rollout_ahead``) everything runs at once.
    """
    running = [c for c in components if c in RUNNING_COMPONENTS]
    phases = [tuple(running)] if concurrent or len(running) < 2 else [(c,) for c in running]
    best = (0, "idle")
    for active in phases:
        total = 0
        for component in components:
            plan = plans[component]
            total += sum(p.nbytes for p in plan.parts if p.counted and not p.transient
                         and (component in active or not (swap and p.swapped)))
            if component in active:
                total += plan.working_bytes()
        best = max(best, (total, " + ".join(active) or "idle"))
    # start-up: every model is loaded before the first hand-over swaps one out
    startup = sum(p.nbytes for c in components for p in plans[c].parts if p.counted and not p.transient)
    return (startup, "start-up (every model loaded)") if startup > best[0] else best


def component_plans(cfg, sizes: ModelSizes, geometry: StepGeometry) -> dict[str, ComponentPlan]:
    """The formula's plan of each component (:mod:`rlrunner.sizing.memory`)."""
    family_cfg = cfg.actor.model[cfg.actor.model.model_type]
    return {"actor": actor_plan(sizes, geometry, str(cfg.actor.strategy), bool(family_cfg.gradient_checkpointing)),
            "rollout": rollout_plan(sizes, geometry, family_cfg), "env": env_plan(cfg.env)}


def formula_device_peaks(cfg, sizes: ModelSizes, geometry: StepGeometry, placement) -> dict[str, int]:
    """The formula's peak bytes per set of devices holding the same components, keyed like ``"0-7"``."""
    plans = component_plans(cfg, sizes, geometry)
    swap = bool(cfg.cluster.enable_offload) and placement.is_collocated("actor", "rollout")
    groups: dict[tuple[str, ...], list[int]] = {}
    for device in placement.used_devices:
        groups.setdefault(placement.components_on(device), []).append(device)
    return {format_devices(devices): device_peak(plans, components, swap=swap,
                                                 concurrent=bool(cfg.runner.rollout_ahead))[0]
            for components, devices in groups.items()}


def render(cfg, sizes: ModelSizes, geometry: StepGeometry, placement, config_name: str,
           memory: DeviceMemory | None) -> list[str]:
    """The plan as printed lines (a warning line starts with ``WARNING:``)."""
    model = cfg.actor.model
    strategy = str(cfg.actor.strategy)
    plans = component_plans(cfg, sizes, geometry)
    lines = [
        (f"rlrunner plan for {config_name!r}: {model.model_type} from {model.model_path} (config files only; no "
         f"weights read)"),
        (f"precision {model.precision} (VAE fp32; LoRA, gradients and AdamW state fp32); actor.strategy {strategy}; "
         f"{placement.num_devices} device(s) ({placement.num_nodes} node(s) x {placement.devices_per_node})"),
        (f"step: {geometry.samples} samples = {geometry.prompts} prompts x group {geometry.group_size}; rollout: "
         f"{geometry.rollout_workers} worker(s), {geometry.samples_per_rollout_call} samples per generate call; "
         f"actor: {geometry.actor_ranks} rank(s), micro-batch {geometry.micro_batch_size}"
         + (f"; context parallel: actor {geometry.actor_cp}, rollout {geometry.rollout_cp} device(s) per sample"
            if max(geometry.actor_cp, geometry.rollout_cp) > 1 else "")),
        "",
    ]
    swap = bool(cfg.cluster.enable_offload) and placement.is_collocated("actor", "rollout")
    groups: dict[tuple[str, ...], list[int]] = {}
    for device in placement.used_devices:
        groups.setdefault(placement.components_on(device), []).append(device)
    warnings = []
    for components, devices in groups.items():
        where = f"device {format_devices(devices)}" if len(devices) == 1 else f"devices {format_devices(devices)}"
        lines.append(f"{where}: {' + '.join(components)}"
                     + (" (collocated; cluster.enable_offload swaps the idle model to host memory)" if swap else ""))
        lines.append(f"  {'component':<10}{'part':<44}{'size':>12}  detail")
        for component in components:
            for part in plans[component].parts:
                size = format_bytes(part.nbytes) if part.counted else f"({format_bytes(part.nbytes)})"
                lines.append(f"  {component:<10}{part.name:<44}{size:>12}  {part.detail}")
            plan = plans[component]
            if component in RUNNING_COMPONENTS:
                estimate = "excluded" if plan.activation_bytes is None else format_bytes(plan.activation_bytes)
                detail = ("no estimate for a non-transformer denoiser" if plan.activation_bytes is None
                          else plan.activation_detail)
                lines.append(f"  {component:<10}{'activations (estimate)':<44}{estimate:>12}  {detail}")
        peak, phase = device_peak(plans, components, swap=swap, concurrent=bool(cfg.runner.rollout_ahead))
        lines.append(f"  {'peak (estimate)':<54}{format_bytes(peak):>12}  while {phase} runs")
        if memory is None:
            lines.append(f"  {'device memory':<54}{'unknown':>12}  no accelerator visible; pass --device-memory GIB")
        else:
            verdict = "fits" if peak <= memory.total_bytes else "DOES NOT FIT"
            lines.append(f"  {'device memory':<54}{format_bytes(memory.total_bytes):>12}  {memory.name}: {verdict}")
            if peak > memory.total_bytes:
                warnings.append(
                    f"WARNING: {where} need about {format_bytes(peak)} at peak but have "
                    f"{format_bytes(memory.total_bytes)} ({memory.name}); try actor.strategy=fsdp2, "
                    f"cluster.enable_offload=true, a smaller actor.micro_batch_size, gradient_checkpointing, or "
                    f"separate devices for actor and rollout")
        lines.append("")
    lines.append("host memory per rollout worker per step (the rollout result, not on the device):")
    for part in host_buffer_parts(sizes, geometry):
        lines.append(f"  {part.name:<44}{format_bytes(part.nbytes):>12}  {part.detail}")
    thread_lines, thread_warnings = ocr_thread_lines(cfg.cluster, cfg.env)
    lines += ["", *thread_lines, *([""] if thread_lines else []), activation_note(sizes.profile)]
    return lines + thread_warnings + warnings  # a device that does not fit is the last line


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bin/rlrunner plan",
        description="Print what each device of a recipe's placement will hold (from the model folder's config "
                    "files; no weights are read) and whether it fits.",
    )
    # optional to argparse, so that a missing name gets our line rather than argparse's (which calls the overrides
    # required too)
    parser.add_argument("config_name", nargs="?",
                        help="recipe file stem (examples/diffusion/config/) or path to a .yaml")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.model.model_path=/models/sd35m")
    parser.add_argument("--device-memory", type=str, default=None, metavar="GIB",
                        help="memory per device to compare against, e.g. 80 or 80GiB (default: the accelerator "
                             "visible here; with --simulate the recipe's comment, else 80 GiB)")
    parser.add_argument("--simulate", action="store_true",
                        help="run the recipe's step at full size on fake tensors and print what it holds per phase")
    parser.add_argument("--json", action="store_true", help="with --simulate: print one JSON object only")
    parser.add_argument("--gpu", default="h100", help=f"with --simulate: the GPU of the predicted step time "
                                                      f"({', '.join(GPU_PEAK_TFLOPS)})")
    parser.add_argument("--mfu", type=float, default=DEFAULT_MFU,
                        help=f"with --simulate: model FLOPs utilisation of the prediction (default {DEFAULT_MFU})")
    return parser.parse_intermixed_args(argv)


def parse_gib(text: str) -> float:
    """``"80"``, ``"80GiB"``, ``"80 GB"`` -> 80.0 (GiB); ``ValueError`` naming the option otherwise."""
    number = text.strip().removesuffix("GiB").removesuffix("GB").removesuffix("G").strip()
    try:
        value = float(number)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise ValueError(f"--device-memory {text!r} is not a memory size; give GiB such as 80 or 80GiB")
    return value


def run_simulation(args: argparse.Namespace, cfg, sizes: ModelSizes, geometry: StepGeometry, placement) -> int:
    """``--simulate``: the simulation's lines (or its JSON object) after the formula's plan."""
    if args.gpu not in GPU_PEAK_TFLOPS:
        raise ValueError(f"--gpu {args.gpu!r} is not known; choose one of {', '.join(GPU_PEAK_TFLOPS)}")
    gib = parse_gib(args.device_memory) if args.device_memory else recipe_device_gib(recipe_path(args.config_name))
    memory = int(gib * 2**30)
    try:
        sim = simulate_recipe(cfg, geometry)
    except (ModelFolderError, ValueError):
        raise
    except Exception as err:  # noqa: BLE001 - the user's boundary: one line, never a traceback
        first = str(err).splitlines()[0] if str(err) else ""
        raise ValueError(f"--simulate cannot run this recipe's step on fake tensors ({type(err).__name__}: "
                         f"{first[:300]})") from None
    swap = bool(cfg.cluster.enable_offload) and placement.is_collocated("actor", "rollout")
    results = device_results(sim, placement, swap=swap)
    if args.json:
        print(json.dumps(simulation_json(results, memory, sim.not_simulated)))
        return 0
    prediction = step_prediction(sim, geometry, args.gpu, args.mfu)
    print("\n".join(["", *simulation_lines(results, formula_device_peaks(cfg, sizes, geometry, placement), memory,
                                            sim.not_simulated, prediction, args.gpu, args.mfu)]))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.config_name is None:
        print("rlrunner: error: the recipe name is missing: bin/rlrunner plan <config_name> [key=value ...]; "
              "bin/rlrunner train --help lists the recipes", file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        cfg = load_recipe(args.config_name, args.overrides, check_datasets=False)
        folder = resolve_model_folder(cfg.actor.model.model_path, Path.cwd())
        sizes = model_sizes(cfg.actor.model, folder)
        placement = parse_placement(cfg.cluster.component_placement, cfg.cluster.num_nodes,
                                    detect_devices_per_node(cfg.cluster))
        geometry = step_geometry(cfg, placement, sizes.guidance)
        memory = (DeviceMemory("--device-memory", int(parse_gib(args.device_memory) * 2**30))
                  if args.device_memory else visible_device_memory())
        if args.simulate:
            if not args.json:
                print("\n".join(render(cfg, sizes, geometry, placement, args.config_name, memory)))
            return run_simulation(args, cfg, sizes, geometry, placement)
    except (RecipeError, ModelFolderError, ValueError, NotImplementedError) as err:
        print(f"rlrunner: error: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
        return EXIT_USER_ERROR
    print("\n".join(render(cfg, sizes, geometry, placement, args.config_name, memory)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
