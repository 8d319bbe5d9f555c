"""How much could RL gain on the tiny model in a CPU recipe's budget? Three measurements that bound it.

    .venv/bin/python bench/tiny_headroom.py                        # the shipped model, 30 oracle steps
    .venv/bin/python bench/tiny_headroom.py --oracle-steps 80      # docs/benchmarks.md: about 10 min on 1 free core
    .venv/bin/python bench/tiny_headroom.py --quick                # seconds, tiny sizes: checks the script runs
                                                                   # (tests/project/test_bench_scripts.py)

1. **Noise temperature**: held-out OCR reward when the initial noise is scaled by T < 1. Lower T gives more
   typical ("modal") samples; the gap to T = 1 is what sharpening the model's distribution could win.
2. **Best of a group**: per-prompt mean, within-group std and best-of-group reward at T = 1 (the spread that
   group-relative advantages feed on).
3. **Oracle distillation**: the same LoRA the recipe trains (rank and alpha from ``tiny_nft_ocr.yaml``), fitted by
   plain flow matching to a *teacher* that is the base model sampled at ``--oracle-temperature`` (each student
   pair is the teacher's starting noise at T = 1 and its sample, so the target map is deterministic). The teacher
   scores far above the base, and the student sees 64 of its samples per step, as an RL step sees 64 rollouts:
   the reward this reaches per step is an upper bound for what an RL signal that has to be discovered (rather
   than handed over) can be expected to reach at the same learning rate and step count.

Held-out reward: Euler, ``--num-steps`` steps, fixed noise, the first ``--num-prompts`` test prompts, the recipe's
OCR reward (RapidOCR recognition only, filtered to the model's alphabet).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlrunner.algorithms.samplers import training_timesteps
from rlrunner.data.prompts import load_prompts
from rlrunner.models import TRAINED_ADAPTER
from rlrunner.models.settings import FamilyConfig
from rlrunner.models.tiny import TinyFlowModel
from rlrunner.rewards import build_reward

DATA = ROOT / "examples/diffusion/data/tiny_ocr"
RECIPE = ROOT / "examples/diffusion/config/tiny_nft_ocr.yaml"
CHUNK = 64  # images per sampling call
#: --quick: the fewest prompts, Euler steps, temperatures, group members and oracle steps
QUICK = {"num_prompts": 1, "num_steps": 2, "temperatures": [1.0], "group_size": 2, "group_prompts": 1,
         "oracle_steps": 1, "oracle_prompts": 1, "eval_every": 1}


class Headroom:
    def __init__(self, args: argparse.Namespace) -> None:
        recipe = OmegaConf.load(RECIPE).actor.model.tiny
        self.args = args
        cfg = OmegaConf.structured(FamilyConfig(resolution=list(recipe.resolution), shift=1.0, use_lora=True,
                                                lora_rank=int(recipe.lora_rank), lora_alpha=int(recipe.lora_alpha),
                                                num_steps=args.num_steps))
        self.model = TinyFlowModel.load(str(args.model_path), cfg, device=torch.device("cpu"), dtype=torch.float32)
        self.reward = build_reward({"model": "ocr", "engine": "rapidocr", "rec_only": True,
                                    "alphabet": self.model.alphabet, "batch_size": CHUNK})
        self.test = load_prompts(DATA, "test")[: args.num_prompts]
        self.eval_noise = torch.randn(len(self.test), *self.model.latent_shape,
                                      generator=torch.Generator().manual_seed(args.seed))

    @torch.no_grad()
    def sample(self, prompts: list[str], noise: torch.Tensor, adapter: str | None) -> torch.Tensor:
        return torch.cat([
            self.model.sample(self.model.encode_prompts(prompts[i : i + CHUNK]), noise[i : i + CHUNK],
                              sampler="euler", num_steps=self.args.num_steps, adapter=adapter)
            for i in range(0, len(prompts), CHUNK)
        ])

    def score(self, prompts: list[str], latents: torch.Tensor) -> np.ndarray:
        return np.asarray(self.reward(self.model.decode(latents), prompts).avg)

    def held_out(self, temperature: float = 1.0, adapter: str | None = None) -> float:
        return float(self.score(self.test, self.sample(self.test, temperature * self.eval_noise, adapter)).mean())

    def temperatures(self) -> None:
        for temperature in self.args.temperatures:
            print(f"  T = {temperature:<4g} held-out reward {self.held_out(temperature):.3f}", flush=True)

    def groups(self) -> None:
        group, prompts = self.args.group_size, self.test[: self.args.group_prompts]
        repeated = [p for p in prompts for _ in range(group)]
        noise = torch.randn(len(repeated), *self.model.latent_shape, generator=torch.Generator().manual_seed(7))
        rewards = self.score(repeated, self.sample(repeated, noise, None)).reshape(len(prompts), group)
        print(f"  {len(prompts)} prompts x {group}: mean {rewards.mean():.3f}, within-group std "
              f"{rewards.std(axis=1).mean():.3f}, best of {group} {rewards.max(axis=1).mean():.3f}, exact "
              f"{(rewards == 1).mean():.3f}", flush=True)

    def oracle(self) -> None:
        args, model = self.args, self.model
        params = model.adapter_parameters(TRAINED_ADAPTER)
        optimizer = torch.optim.AdamW(params, lr=args.oracle_lr, weight_decay=1e-4)
        train, rng = load_prompts(DATA, "train"), random.Random(args.seed)
        generator = torch.Generator().manual_seed(args.seed)
        grid = training_timesteps(args.num_steps)
        start = self.held_out(adapter=TRAINED_ADAPTER)
        print(f"  step 0: held-out reward {start:.3f}", flush=True)
        for step in range(1, args.oracle_steps + 1):
            prompts = [p for p in rng.sample(train, args.oracle_prompts) for _ in range(args.group_size)]
            eps = torch.randn(len(prompts), *model.latent_shape, generator=generator)
            x0 = self.sample(prompts, args.oracle_temperature * eps, None)
            t = grid[torch.randint(0, args.num_steps, (len(prompts),), generator=generator)]
            t_b = t.reshape(-1, *([1] * (x0.dim() - 1)))
            x_t = (1 - t_b) * x0 + t_b * eps
            cond = model.encode_prompts(prompts)
            loss = torch.nn.functional.mse_loss(model.velocity(x_t, t, cond, adapter=TRAINED_ADAPTER), eps - x0)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            if step % args.eval_every == 0 or step == args.oracle_steps:
                print(f"  step {step}: held-out reward {self.held_out(adapter=TRAINED_ADAPTER):.3f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", type=Path, default=ROOT / "examples/diffusion/models/tiny-ocr-flow")
    p.add_argument("--num-prompts", type=int, default=128, help="held-out prompts (fixed noise)")
    p.add_argument("--num-steps", type=int, default=10, help="Euler steps, as in the recipe")
    p.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.8, 0.6, 0.5, 0.4],
                   help="include --oracle-temperature to see the teacher's score")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--group-prompts", type=int, default=32)
    p.add_argument("--oracle-steps", type=int, default=30, help="0 skips the oracle")
    p.add_argument("--oracle-prompts", type=int, default=8, help="prompts per oracle step (x group size samples)")
    p.add_argument("--oracle-lr", type=float, default=1e-3, help="the recipe's actor.optim.lr")
    p.add_argument("--oracle-temperature", type=float, default=0.5)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=99)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help=f"seconds, tiny sizes {QUICK}: checks that the script runs "
                                                        "(flags given beside it still win)")
    args = p.parse_args()
    if args.quick:
        p.set_defaults(**QUICK)
        args = p.parse_args()
    torch.set_num_threads(args.threads)
    start = time.time()
    bench = Headroom(args)
    print(f"model: {args.model_path}")
    print("1. noise temperature (initial noise x T)")
    bench.temperatures()
    print("2. groups at T = 1")
    bench.groups()
    if args.oracle_steps:
        print(f"3. oracle: LoRA distilled from the base at T = {args.oracle_temperature:g}, "
              f"{args.oracle_prompts * args.group_size} pairs per step, lr {args.oracle_lr:g}")
        bench.oracle()
    print(f"done in {(time.time() - start) / 60:.1f} min")


if __name__ == "__main__":
    main()
