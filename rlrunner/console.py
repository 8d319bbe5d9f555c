"""What a run writes to the console besides its progress bar: a line per step where no bar can be drawn, a line
before each eval, and the summary it ends with (what it learned, how long it took, where its outputs are)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from rlrunner.checkpoint import complete_checkpoints


def step_line(step: int, max_steps: int, metrics: dict[str, float]) -> str:
    """The step's progress as a plain line, for a console that is a log file (the launcher tees it), where a
    progress bar's carriage-return redraws would pile up."""
    return (f"[step {step}/{max_steps}] reward {metrics['env/avg']:.3f}, loss {metrics['train/actor/nft_loss']:.4f}, "
            f"{metrics['time/step']:.1f} s/step")


def eval_line(step: int, num_prompts: int, model_cfg: Any) -> str:
    """Said before an eval starts (the first one, at step 0, can take minutes with no other sign of life)."""
    family = model_cfg[model_cfg.model_type]
    return (f"[step {step}] eval: {num_prompts} held-out prompts, one sample each, {family.eval_num_steps} "
            f"{family.eval_sampler} steps")


def run_summary(log_dir: Path, steps: int, seconds: float, evals: list[tuple[int, float]], tensorboard: bool) -> str:
    """A few lines for the console: held-out reward at the first and last eval of this process, steps, wall time,
    the checkpoint and TensorBoard folders and the command that exports the last checkpoint's LoRA for diffusers."""
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
