"""A :class:`~rlrunner.sizing.simulate.Simulation` per device of a placement, as text and as JSON, with the
predicted step time from its FLOPs.

Per device, the components placed there take turns in the order a step runs them (:data:`PHASE_ORDER`): the
running component holds its phase's peak, each other one what it keeps between its phases (its ``resident``
bytes), less what ``cluster.enable_offload`` moves to host memory (``swappable``) once turns begin. The actor is
built first and the rollout beside it before the first hand-over, so ``rollout_load`` counts the whole actor. The
env runs no simulated phase: its reward models' weights (at the plan's sizes) count in every phase of its devices,
and alone on a device they are its ``idle`` peak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlrunner.sizing.memory import format_bytes
from rlrunner.sizing.simulate import Simulation

GIB = 2**30
#: phases in the order a run goes through them: start-up, then one step
PHASE_ORDER = ("actor_load", "rollout_load", "rollout", "decode", "update", "ema", "weight_sync")
#: phases before the first hand-over of the devices (every component resident)
START_PHASES = ("actor_load", "rollout_load")
#: dense bf16 tensor-core peak per GPU, TFLOP/s (vendors' data sheets; no sparsity)
GPU_PEAK_TFLOPS = {"a100": 312.0, "a800": 312.0, "h100": 989.0, "h800": 989.0, "h200": 989.0, "h20": 148.0,
                   "b200": 2250.0, "l40s": 362.0, "910b": 320.0}
#: model FLOPs utilisation assumed for the prediction (a typical figure for diffusion transformer training)
DEFAULT_MFU = 0.35
DEFAULT_DEVICE_GIB = 80.0
_COMMENT_MEMORY = re.compile(r"(\d+)\s*x\s*(\d+)\s*GB", re.IGNORECASE)


@dataclass(frozen=True)
class DeviceResult:
    """Simulated bytes of one group of alike devices, per phase."""

    devices: str  # "0-7"
    components: tuple[str, ...]
    phases: dict[str, int]
    categories: dict[str, dict[str, int]]  # per phase: its peak's bytes by category

    @property
    def by_category(self) -> dict[str, int]:
        """The peak phase's bytes by category."""
        return self.categories[self.peak_phase]

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    @property
    def peak(self) -> int:
        return self.phases[self.peak_phase]


def recipe_device_gib(recipe_file: Path) -> float:
    """Device memory the recipe's comment names (``8 x 80 GB``), else :data:`DEFAULT_DEVICE_GIB`."""
    try:
        found = _COMMENT_MEMORY.search("\n".join(line for line in recipe_file.read_text().splitlines()
                                                 if line.lstrip().startswith("#")))
    except OSError:
        found = None
    return float(found.group(2)) if found else DEFAULT_DEVICE_GIB


def device_results(sim: Simulation, placement: Any, *, swap: bool) -> list[DeviceResult]:
    """One :class:`DeviceResult` per set of devices holding the same components (module docstring)."""
    from rlrunner.cluster.placement import format_devices

    groups: dict[tuple[str, ...], list[int]] = {}
    for device in placement.used_devices:
        groups.setdefault(placement.components_on(device), []).append(device)
    results = []
    for components, devices in groups.items():
        runs = [sim.components[c] for c in components if c in sim.components]
        phases: dict[str, int] = {}
        categories: dict[str, dict[str, int]] = {}
        for phase in PHASE_ORDER:
            for run in runs:
                if phase not in run.phases:
                    continue
                # the rollout is built after the actor's load; the env's reward models may be there already
                others = [o for o in runs if o is not run and (phase != "actor_load" or o.name == "env")]
                idle = sum(o.resident - (o.swappable if swap and phase not in START_PHASES else 0) for o in others)
                phases[phase] = run.phases[phase].peak + idle
                categories[phase] = dict(run.phases[phase].by_category)
                if idle:
                    categories[phase]["other components (idle)"] = idle
        if not phases and runs:  # devices of the env alone: its reward models' weights, all the time
            phases["idle"] = sum(run.resident for run in runs)
            categories["idle"] = {"parameters": phases["idle"]}
        if phases:
            results.append(DeviceResult(format_devices(devices), components, phases, categories))
    return results


def step_prediction(sim: Simulation, geometry: Any, gpu: str, mfu: float) -> dict[str, float]:
    """FLOPs per step (from the simulation) and, for ``gpu`` at ``mfu``, the predicted step seconds and images per
    GPU per second: rollout calls then the actor's update, each device busy in turn."""
    peak = GPU_PEAK_TFLOPS[gpu] * 1e12 * mfu
    rollout = sim.components.get("rollout")
    actor = sim.components.get("actor")
    rollout_flops = sum(rollout.flops.values()) * geometry.rollout_rounds if rollout else 0
    actor_flops = sum(actor.flops.values()) if actor else 0
    seconds = rollout_flops / peak + actor_flops / peak
    workers = max(geometry.rollout_groups, 1)
    total = rollout_flops * workers + actor_flops * geometry.actor_ranks
    devices = max(geometry.rollout_workers, geometry.actor_ranks, 1)
    return {"flops_per_step": float(total), "step_seconds": seconds,
            "images_per_gpu_per_s": geometry.samples / seconds / devices if seconds else 0.0}


def simulation_json(results: list[DeviceResult], memory_bytes: int, not_simulated: list[str]) -> dict[str, Any]:
    """The ``--json`` object: ``{"fits", "devices": [...], "not_simulated"}`` (docs/clusters.md "Will it fit?");
    each device's ``peak_by_category`` is what its peak phase held, by category, and ``categories`` the same for
    every phase."""
    return {
        "fits": all(r.peak <= memory_bytes for r in results),
        "devices": [{"device": r.devices, "components": list(r.components), "peak_gib": round(r.peak / GIB, 3),
                     "peak_phase": r.peak_phase, "phases": {p: round(b / GIB, 3) for p, b in r.phases.items()},
                     "peak_by_category": {c: round(b / GIB, 3) for c, b in r.by_category.items()},
                     "categories": {p: {c: round(b / GIB, 3) for c, b in cats.items()}
                                    for p, cats in r.categories.items()}}
                    for r in results],
        "not_simulated": list(not_simulated),
    }


def simulation_lines(results: list[DeviceResult], formula_peaks: dict[str, int], memory_bytes: int,
                     not_simulated: list[str], prediction: dict[str, float] | None, gpu: str, mfu: float) -> list[str]:
    """The simulation as printed lines (per device: phases, the peak's categories, the formula's peak)."""
    lines = ["simulated at full size on fake tensors (rank 0 of each group; no weights read):"]
    for r in results:
        verdict = "fits" if r.peak <= memory_bytes else "DOES NOT FIT"
        lines.append(f"device {r.devices}: {' + '.join(r.components)}")
        for phase, nbytes in r.phases.items():
            lines.append(f"  {phase:<44}{format_bytes(nbytes):>12}" + ("  <- peak" if phase == r.peak_phase else ""))
        for category, nbytes in sorted(r.by_category.items(), key=lambda item: -item[1]):
            lines.append(f"    at the peak: {category:<30}{format_bytes(nbytes):>12}")
        formula = formula_peaks.get(r.devices)
        ratio = f" (formula {format_bytes(formula)}, simulated / formula {r.peak / formula:.2f})" if formula else ""
        lines.append(f"  simulated peak {format_bytes(r.peak)} of {format_bytes(memory_bytes)}: {verdict}{ratio}")
    if prediction:
        lines.append(f"FLOPs per step (all devices, from the simulation): {prediction['flops_per_step']:.3g}")
        lines.append(f"PREDICTION for {gpu} at {mfu:.0%} MFU (dense bf16 peak {GPU_PEAK_TFLOPS[gpu]:.0f} TFLOP/s; "
                     f"not measured): {prediction['step_seconds']:.1f} s per step, "
                     f"{prediction['images_per_gpu_per_s']:.3f} images/GPU/s")
    lines += [f"not simulated: {item}" for item in not_simulated]
    return lines
