"""What a run writes to the console besides its progress bar: a line per step where no bar can be drawn, a line
before each eval, and the summary it ends with (what it learned, how long it took, where its outputs are)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rlrunner.checkpoint import complete_checkpoints


def report_step(progress: tqdm, step: int, max_steps: int, metrics: dict[str, float], loss_key: str) -> None:
    """Advance the progress bar; where no bar is drawn (the console is a log file: the launcher tees it, and
    carriage-return redraws would pile up there) print the step as a plain line instead. ``loss_key``: the
    algorithm's loss metric (``Objective.loss_key``)."""
    progress.update(1)
    reward, loss, seconds = metrics["env/avg"], metrics[f"train/actor/{loss_key}"], metrics["time/step"]
    progress.set_postfix(reward=f"{reward:.3f}", loss=f"{loss:.4f}", step_s=f"{seconds:.1f}")
    if progress.disable:
        tqdm.write(f"[step {step}/{max_steps}] reward {reward:.3f}, loss {loss:.4f}, {seconds:.1f} s/step",
                   file=sys.stderr)


def eval_line(step: int, num_prompts: int, model_cfg: Any) -> str:
    """Said before an eval starts (the first one, at step 0, can take minutes with no other sign of life)."""
    family = model_cfg[model_cfg.model_type]
    return (f"[step {step}] eval: {num_prompts} held-out prompts, one sample each, {family.eval_num_steps} "
            f"{family.eval_sampler} steps")


def run_summary(log_dir: Path, steps: int, seconds: float, tensorboard: bool) -> str:
    """A few lines for the console: held-out reward at the first and last eval of the run (its metrics.jsonl),
    steps, wall time, the checkpoint and TensorBoard folders and the command that exports the last checkpoint's LoRA
    for diffusers."""
    metrics = log_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    evals = [(r["step"], r["eval/avg"]) for r in records if "eval/avg" in r]
    checkpoints = complete_checkpoints(log_dir / "checkpoints")
    minutes, secs = divmod(round(seconds), 60)
    lines = [f"rlrunner: done: {steps} step(s) in {minutes}m{secs:02d}s; logs in {log_dir}"]
    if evals:
        (first_step, first), (last_step, last) = evals[0], evals[-1]
        change = f" ({last - first:+.4f})" if last_step != first_step else ""
        lines.append(f"  held-out reward: {first:.4f} at step {first_step} -> {last:.4f} at step {last_step}{change}")
    if tensorboard:
        lines.append(f"  TensorBoard:     tensorboard --logdir {shlex.quote(str(log_dir / 'tensorboard'))}")
    if checkpoints:
        lines.append(f"  checkpoints:     {checkpoints[-1].parent}")
        lines.append(f"  export the LoRA: python -m rlrunner.export {shlex.quote(str(checkpoints[-1]))} --out "
                     f"{shlex.quote(str(log_dir / 'lora'))}")
    return "\n".join(lines)
