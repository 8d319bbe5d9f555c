"""Bytes per training step that the driver materialises and that cross between processes: today's path vs issue 14's.

    .venv/bin/python bench/data_plane.py                    # the four GPU recipes at their real model sizes
    .venv/bin/python bench/data_plane.py --recipe sd3_nft_ocr --model-folder sd3=/models/sd35m
    .venv/bin/python bench/data_plane.py --recipe sd3_nft_ocr --set algorithm.name=flow_grpo   # recipe overrides

Shapes come from the recipes' batch sizes and each family's ``sample_shapes`` applied to the model folder's config
files (default: the config-only copies of the published checkpoints in ``bench/model_configs/``; no weights are
read). Per step of N samples (N / group_size prompts):

* today: the rollout returns x0 ``[N, latent]``, the text conditioning repeated per sample ``[N, ...]`` and the
  decoded uint8 images or frames to the driver; the driver sends x0 + conditioning to the actor and the pixels to
  the env workers. The driver materialises all of it and every tensor crosses twice.
* new: rollout -> actor directly (x0, conditioning once per prompt, an int64 prompt index per sample), rollout
  -> env directly (pixels); the driver materialises only ``runner.num_logged_samples`` sample images and scalars.

In both, rewards cross env -> driver and advantages driver -> actor (float32, one per sample, or per latent-frame
chunk for ``grpo_video``). Prints the tensors and the ratios new / today.

Then the training bytes each actor rank fetches per step (x0 and the algorithm's kept latents, the conditioning of
the prompts its rows belong to, once each, and an int64 prompt index per row), and per node, for 1 and 8 actor ranks
per node: today every rank fetches every rollout shard's whole training part and keeps 1/ranks of it; now each
rank fetches only its rows (:class:`rlrunner.step.sample_order.TrainPlan`, the runner's own cut of step 0).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch

from rlrunner.cluster.placement import parse_placement
from rlrunner.recipe import load_recipe
from rlrunner.sizing.memory import ModelSizes, StepGeometry, format_bytes, model_sizes, step_geometry
from rlrunner.step.sample_order import TrainPlan

CONFIGS = ROOT / "bench" / "model_configs"
REFERENCE_RECIPES = {
    "sd3_nft_ocr": CONFIGS / "stable-diffusion-3.5-medium",
    "wan22_ti2v_5b_nft_ocr": CONFIGS / "wan2.2-ti2v-5b",
    "wan22_ti2v_5b_nft_video_ocr": CONFIGS / "wan2.2-ti2v-5b",
    "qwen_image_nft_ocr": CONFIGS / "qwen-image",
}
INDEX_BYTES = 8  # int64 prompt index per sample
SCALAR_BYTES = 4  # float32 reward / advantage


@dataclass(frozen=True)
class Flow:
    """One tensor of a step: bytes the driver holds and bytes that cross process boundaries, per path."""

    name: str
    today_driver: int
    today_crossing: int
    new_driver: int
    new_crossing: int


def step_flows(sizes: ModelSizes, geometry: StepGeometry, rewards_per_sample: int) -> list[Flow]:
    n, prompts = geometry.samples, geometry.prompts
    x0, pixels = sizes.latent_bytes(n), sizes.pixel_bytes(n)
    cond_repeated, cond_once = sizes.cond_bytes(n), sizes.cond_bytes(prompts)
    scalars = n * rewards_per_sample * SCALAR_BYTES
    logged = sizes.pixel_bytes(geometry.num_logged_samples)
    return [
        # today: rollout -> driver -> actor; new: rollout -> actor
        Flow("x0", x0, 2 * x0, 0, x0),
        Flow("text conditioning", cond_repeated, 2 * cond_repeated, 0, cond_once),
        Flow("prompt index (int64)", 0, 0, 0, n * INDEX_BYTES),
        # today: rollout -> driver -> env; new: rollout -> env, and the logged few rollout -> driver
        Flow("decoded pixels", pixels, 2 * pixels, 0, pixels),
        Flow(f"logged samples ({geometry.num_logged_samples})", 0, 0, logged, logged),
        # both: env -> driver (rewards), driver -> actor (advantages)
        Flow("rewards + advantages", 2 * scalars, 2 * scalars, 2 * scalars, 2 * scalars),
    ]


def training_bytes(sizes: ModelSizes, geometry: StepGeometry, samples: torch.Tensor) -> int:
    """Bytes of the training rows ``samples`` (sample indices of a step): latents, their prompts' conditioning once
    (a prompt's group is contiguous, so its prompt is ``index // group_size``) and an int64 prompt index each."""
    prompts = len(torch.unique(samples // geometry.group_size))
    rows = len(samples)
    return sizes.latent_bytes(rows) * (1 + geometry.kept_latents) + sizes.cond_bytes(prompts) + rows * INDEX_BYTES


def actor_fetch_lines(sizes: ModelSizes, geometry: StepGeometry, seed: int, global_batch_size: int) -> list[str]:
    """Training bytes fetched per actor rank and per node, today (every rank fetches all) vs now (its own rows)."""
    everything = training_bytes(sizes, geometry, torch.arange(geometry.samples))
    lines = [(f"  training bytes fetched per step by the actor{'':<8}{'today: rank':>13}{'node':>12}"
             f"{'now: rank':>13}{'node':>12}{'rank now/today':>16}")]
    for nodes, per_node in ((1, 1), (1, 8), (8, 1)):
        ranks = nodes * per_node
        plan = TrainPlan.build(seed, 0, geometry.samples, global_batch_size, ranks)
        mine = [training_bytes(sizes, geometry, plan.samples(r)) for r in range(ranks)]
        prompts = max(len(torch.unique(plan.samples(r) // geometry.group_size)) for r in range(ranks))
        worst = max(mine)
        lines.append(f"  {f'{ranks} rank(s), {per_node} per node ({prompts}/{geometry.prompts} prompts a rank)':<46}"
                     f"{format_bytes(everything):>13}{format_bytes(per_node * everything):>12}"
                     f"{format_bytes(worst):>13}{format_bytes(per_node * worst):>12}{worst / everything:>16.4f}")
    own_cond = sizes.cond_bytes(prompts)
    lines.append(f"  8 ranks: a rank's bytes {format_bytes(worst)} <= today / 8 + the conditioning of its own prompts "
                 f"= {format_bytes(everything // 8)} + {format_bytes(own_cond)}: "
                 f"{worst <= everything / 8 + own_cond}")
    return lines


def report(recipe: str, folder: Path, overrides: list[str]) -> list[str]:
    cfg = load_recipe(recipe, [f"actor.model.model_path={folder}", "cluster.num_devices_per_node=1", *overrides],
                      check_datasets=False)
    sizes = model_sizes(cfg.actor.model, folder)
    placement = parse_placement(cfg.cluster.component_placement, cfg.cluster.num_nodes, 1)
    geometry = step_geometry(cfg, placement, sizes.guidance)
    # grpo_video scores one reward per latent-frame chunk
    per_sample = sizes.shapes.latent[1] if cfg.algorithm.adv_type == "grpo_video" else 1
    flows = step_flows(sizes, geometry, per_sample)
    today_driver, today_cross = sum(f.today_driver for f in flows), sum(f.today_crossing for f in flows)
    new_driver, new_cross = sum(f.new_driver for f in flows), sum(f.new_crossing for f in flows)
    cond = next(f for f in flows if f.name == "text conditioning")
    where = folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder
    cond_shapes = {name: list(shape) for name, (shape, _) in sizes.shapes.cond.items()}
    lines = [(f"{' '.join([recipe, *overrides])}: {cfg.actor.model.model_type} from {where}; {geometry.samples} "
              f"samples = {geometry.prompts} "
              f"prompts x group {geometry.group_size}; latent {list(sizes.shapes.latent)}, pixels "
              f"{list(sizes.shapes.pixels)}, conditioning {cond_shapes}"),
             f"  {'tensor':<26}{'today: driver':>15}{'crosses':>12}{'new: driver':>15}{'crosses':>12}"]
    for f in [*flows, Flow("total", today_driver, today_cross, new_driver, new_cross)]:
        lines.append(f"  {f.name:<26}{format_bytes(f.today_driver):>15}{format_bytes(f.today_crossing):>12}"
                     f"{format_bytes(f.new_driver):>15}{format_bytes(f.new_crossing):>12}")
    lines.append(f"  new / today: conditioning bytes crossing {cond.new_crossing / cond.today_crossing:.4f} "
                 f"(<= 1/group_size = {1 / geometry.group_size:.4f}: once per prompt and one hop instead of two); "
                 f"driver materialises {new_driver / today_driver:.4f} (logged samples and scalars only); "
                 f"all bytes crossing {new_cross / today_cross:.4f}")
    return lines + actor_fetch_lines(sizes, geometry, cfg.runner.seed, cfg.actor.global_batch_size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--recipe", action="append", choices=sorted(REFERENCE_RECIPES),
                        help="recipe to report (repeatable; default: all four GPU recipes)")
    parser.add_argument("--model-folder", action="append", default=[], metavar="RECIPE=FOLDER",
                        help="model folder (config files suffice) for a recipe instead of bench/model_configs/")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="recipe override applied to every reported recipe (repeatable)")
    args = parser.parse_args(argv)
    folders = dict(REFERENCE_RECIPES)
    for item in args.model_folder:
        recipe, _, folder = item.partition("=")
        if recipe not in folders or not folder:
            parser.error(f"--model-folder {item!r}: expected RECIPE=FOLDER with RECIPE one of {sorted(folders)}")
        folders[recipe] = Path(folder).resolve()
    for recipe in args.recipe or list(REFERENCE_RECIPES):
        print("\n".join(report(recipe, folders[recipe], args.set)) + "\n")
    print("Text lengths are the recipes' max_sequence_length (Qwen-Image pads to the longest prompt of a batch, so its "
          "conditioning is an upper bound); the rollout's own device tensors and Ray's per-object overhead are not "
          "counted.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
