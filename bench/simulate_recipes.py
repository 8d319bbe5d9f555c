"""Every shipped GPU recipe simulated at full size on its config-only folder, beside the formula's plan.

    python bench/simulate_recipes.py                      # all GPU recipes (minutes each, one at a time)
    python bench/simulate_recipes.py flux1_dev_nft_ocr    # one
    python bench/simulate_recipes.py --out bench/simulated_recipes.json   # and record them (the tests read it)
    python bench/simulate_recipes.py --table bench/simulated_recipes.json # docs/clusters.md's table, from the record
    python bench/simulate_recipes.py --constants bench/simulated_recipes.json  # the plan's activation constants

Each recipe runs ``bin/rlrunner plan <recipe> actor.model.model_path=bench/model_configs/<folder> --simulate
--json`` in its own process (one simulation at a time: memory and cores are shared), with the device count its
comment names (``8 x 80 GB``), and the table prints, per recipe: the formula's largest per-device peak (GiB), the
simulation's, their ratio (simulated / formula), whether the simulation fits, and the seconds it took.

``--out`` merges each simulation into the record (other recipes' entries stay; the formula's peak is left out, as
the tests compute it from the code of the day), with the commit, the date and the
fingerprint of what it simulated (:func:`rlrunner.sizing.record.recipe_fingerprint`): ``bench/simulated_recipes.json``
is the record ``tests/sizing/test_plan_vs_simulation.py`` holds the formula and the recipes to. It also rewrites the
families' activation constants that the formula reads (``rlrunner/sizing/measured_activations.py``, as
``--constants`` does).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlrunner.cluster.placement import parse_placement  # after the path set-up above
from rlrunner.cluster.resources import detect_devices_per_node
from rlrunner.commands.plan import formula_device_peaks
from rlrunner.config.loader import recipe_path
from rlrunner.recipe import load_recipe
from rlrunner.sizing.activations import measured_constants
from rlrunner.sizing.memory import ModelSizes, StepGeometry, model_sizes, resolve_model_folder, step_geometry
from rlrunner.sizing.record import read_record, recipe_fingerprint
from rlrunner.sizing.sim_report import GIB, recipe_device_gib

#: GPU recipe -> its config-only folder under bench/model_configs/
RECIPE_FOLDERS = {
    "flux1_dev_nft_ocr": "flux.1-dev",
    "flux2_klein_nft_ocr": "flux.2-klein-4b",
    "qwen_image_nft_ocr": "qwen-image",
    "sd35_large_nft_ocr": "stable-diffusion-3.5-large",
    "sd3_nft_ocr": "stable-diffusion-3.5-medium",
    "sd3_nft_ocr_nvlabs": "stable-diffusion-3.5-medium",
    "sd3_nft_geneval": "stable-diffusion-3.5-medium",
    "sd3_nft_multi_reward": "stable-diffusion-3.5-medium",
    "wan22_ti2v_5b_nft_ocr": "wan2.2-ti2v-5b",
    "wan22_ti2v_5b_nft_video_ocr": "wan2.2-ti2v-5b",
    "wan22_t2v_a14b_nft_video_ocr": "wan2.2-t2v-a14b",
    "zimage_nft_ocr": "z-image",
}
_DEVICES = re.compile(r"(\d+)\s*x\s*\d+\s*GB", re.IGNORECASE)
TIMEOUT_S = 900
RECORD_PATH = "bench/simulated_recipes.json"
#: what the plan reads the families' activation constants from (written from the record: --constants, --out)
CONSTANTS_PATH = ROOT / "rlrunner" / "sizing" / "measured_activations.py"


def recipe_devices(recipe: str) -> int:
    """Devices per node the recipe's comment names (``8 x 80 GB``), else 8."""
    found = _DEVICES.search(recipe_path(recipe).read_text())
    return int(found.group(1)) if found else 8


def plan_overrides(recipe: str) -> list[str]:
    """The overrides a recipe is planned and simulated with: its config folder and its comment's device count."""
    return [f"actor.model.model_path=bench/model_configs/{RECIPE_FOLDERS[recipe]}",
            f"cluster.num_devices_per_node={recipe_devices(recipe)}"]


def fingerprint(recipe: str) -> str:
    """:func:`rlrunner.sizing.record.recipe_fingerprint` of the recipe as :func:`plan_overrides` plans it."""
    cfg = load_recipe(recipe, plan_overrides(recipe), check_datasets=False)
    return recipe_fingerprint(cfg, ROOT / "bench" / "model_configs" / RECIPE_FOLDERS[recipe], ROOT)


@functools.cache  # the docs table, the constants and tests/sizing/test_plan_vs_simulation.py ask more than once
def recipe_plan_inputs(recipe: str) -> tuple[Any, ModelSizes, StepGeometry, Any]:
    """The recipe as :func:`plan_overrides` plans it, its model's sizes, its step's geometry and its placement."""
    cfg = load_recipe(recipe, plan_overrides(recipe), check_datasets=False)
    sizes = model_sizes(cfg.actor.model, resolve_model_folder(cfg.actor.model.model_path, ROOT))
    placement = parse_placement(cfg.cluster.component_placement, cfg.cluster.num_nodes,
                                detect_devices_per_node(cfg.cluster))
    return cfg, sizes, step_geometry(cfg, placement, sizes.guidance), placement


def formula_peaks(recipe: str) -> dict[str, int]:
    """The formula's peak bytes per set of alike devices (``"0-7"``), as ``bin/rlrunner plan`` computes them."""
    return formula_device_peaks(*recipe_plan_inputs(recipe))


def recipe_constants(recipe: str, entry: dict) -> dict[str, float]:
    """The activation constants that the recipe's recorded simulation measures
    (:func:`rlrunner.sizing.activations.measured_constants`), from each phase's largest activations over its
    devices."""
    cfg, sizes, geometry, _ = recipe_plan_inputs(recipe)
    activations: dict[str, int] = {}
    for device in entry["simulation"]["devices"]:
        for phase in ("rollout", "update", "decode"):
            gib = device["categories"].get(phase, {}).get("activations")
            if gib is not None:
                activations[phase] = max(activations.get(phase, 0), int(gib * GIB))
    model = cfg.actor.model
    return measured_constants(sizes, activations, sampling_batch=geometry.samples_per_rollout_call * geometry.cfg_factor,
                              training_batch=geometry.micro_batch_size,
                              checkpointing=bool(model[model.model_type].gradient_checkpointing),
                              rollout_cp=geometry.rollout_cp, actor_cp=geometry.actor_cp)


def constants_module(record: dict[str, dict]) -> str:
    """rlrunner/sizing/measured_activations.py as the record gives it: per family, each constant the largest over
    its recorded recipes, rounded up to a tenth (the plan stays at or above every simulation it was fitted to)."""
    measured: dict[str, dict[str, tuple[float, str]]] = {}
    for recipe in sorted(record):
        if "simulation" not in record[recipe]:
            continue
        family = measured.setdefault(str(recipe_plan_inputs(recipe)[0].actor.model.model_type), {})
        for name, value in recipe_constants(recipe, record[recipe]).items():
            if name not in family or value > family[name][0]:
                family[name] = (value, recipe)
    lines = [f'"""Generated by `bin/rlrunner python bench/simulate_recipes.py --constants {RECORD_PATH}` from the record',
             "of full-size simulations; do not edit (tests/sizing/test_plan_vs_simulation.py fails when it is not what the",
             "record gives). Per family: the :class:`~rlrunner.models.shapes.ActivationProfile` constants of its recorded",
             "recipes (:func:`rlrunner.sizing.activations.measured_constants`), each the largest, rounded up to a tenth,",
             'with the recipe it came from."""',
             "",
             "MEASURED_ACTIVATIONS: dict[str, dict[str, float]] = {"]
    for family in sorted(measured):
        lines.append(f'    "{family}": {{')
        for name in ("sampling", "training", "decode"):
            if name in measured[family]:
                value, recipe = measured[family][name]
                lines.append(f'        "{name}": {math.ceil(value * 10 - 1e-9) / 10},  # {recipe}')
        lines.append("    },")
    return "\n".join([*lines, "}", ""])


def fit_table(record: dict[str, dict]) -> list[str]:
    """docs/clusters.md "Will it fit?": per recipe and set of devices, the simulated peak (and its phase) from the
    record beside the formula's, their ratio, whether the simulation fits the recipe's device, and its seconds."""
    lines = ["| recipe | devices | simulated GiB (phase) | formula GiB | formula / simulated | fits | seconds |",
             "|---|---|---|---|---|---|---|"]
    for recipe in sorted(record):
        entry = record[recipe]
        formula = formula_peaks(recipe)
        device_gib = recipe_device_gib(recipe_path(recipe))
        for device in entry["simulation"]["devices"]:
            planned = formula[device["device"]] / GIB
            lines.append(f"| `{recipe}` | {device['device']} | {device['peak_gib']:.1f} ({device['peak_phase']}) | "
                         f"{planned:.1f} | {planned / device['peak_gib']:.2f} | "
                         f"{'yes' if device['peak_gib'] <= device_gib else 'NO'} ({device_gib:g} GiB) | "
                         f"{entry['seconds']} |")
    return lines


def _plan(recipe: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlrunner.commands.plan", recipe, *plan_overrides(recipe), *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def simulate(recipe: str) -> tuple[dict | str, float]:
    """The ``--json`` object of the recipe's simulation (or its one-line error) and the seconds it took."""
    started = time.perf_counter()
    done = _plan(recipe, "--simulate", "--json")
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        return (done.stderr.strip().splitlines() or ["(no message)"])[-1], seconds
    return json.loads(done.stdout), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipes", nargs="*", default=list(RECIPE_FOLDERS), help="recipes (default: every GPU one)")
    parser.add_argument("--out", type=Path, help="write every recipe's result here as JSON (rewritten after each)")
    parser.add_argument("--table", type=Path, metavar="RECORD",
                        help="simulate nothing: print docs/clusters.md's table from this record and today's formula")
    parser.add_argument("--constants", type=Path, metavar="RECORD",
                        help=f"simulate nothing: write {CONSTANTS_PATH.relative_to(ROOT)} (the families' activation "
                             "constants) from this record")
    args = parser.parse_args()
    if args.table:
        print("\n".join(fit_table(read_record(args.table))))
        return
    if args.constants:
        CONSTANTS_PATH.write_text(constants_module(read_record(args.constants)))
        print(f"wrote {CONSTANTS_PATH.relative_to(ROOT)}")
        return
    print(f"{'recipe':<32}{'formula GiB':>12}{'simulated GiB':>15}{'ratio':>7}{'fits':>6}{'seconds':>9}")
    recorded = read_record(args.out) if args.out else {}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=False).stdout.strip()
    for recipe in args.recipes:
        formula = max(formula_peaks(recipe).values()) / GIB
        result, seconds = simulate(recipe)
        recorded[recipe] = {"seconds": round(seconds),
                            "devices": recipe_devices(recipe), "folder": RECIPE_FOLDERS[recipe], "commit": commit,
                            "date": datetime.date.today().isoformat(),
                            "fingerprint": fingerprint(recipe),
                            **({"error": result} if isinstance(result, str) else {"simulation": result})}
        if args.out:
            args.out.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")
            CONSTANTS_PATH.write_text(constants_module(recorded))
        if isinstance(result, str):
            print(f"{recipe:<32}{formula:>12.1f}{'-':>15}{'-':>7}{'-':>6}{seconds:>9.0f}  {result}")
            continue
        simulated = max(device["peak_gib"] for device in result["devices"])
        ratio = simulated / formula if formula else float("nan")
        print(f"{recipe:<32}{formula:>12.1f}{simulated:>15.1f}{ratio:>7.2f}{result['fits']!s:>6}{seconds:>9.0f}",
              flush=True)


if __name__ == "__main__":
    main()
