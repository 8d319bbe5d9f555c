"""What a run writes to the console besides its progress bar: a line per step where no bar can be drawn, a line
before each eval, and the summary it ends with (what it learned, how long it took, where its outputs are); and
the copy of it all in the run's ``console.log``."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from rlrunner.config.paths import REPO_DIR

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# <log_dir>/watch_alarms.jsonl: a line per alarm of the reward-hacking watch (rlrunner.run.watch), for the summary
WATCH_FILE = "watch_alarms.jsonl"


class ConsoleTee:
    """A console stream that also writes to the run's ``console.log``, without the progress bar's redraws.

    tqdm redraws its bar with writes that hold a carriage return (``\\r``); those, and the newline that closes a
    bar, stay on the terminal, so the log holds plain lines. :meth:`log_only` writes a line to the log alone (the
    step lines a drawn bar stands for)."""

    def __init__(self, stream: IO[str], log_file: IO[str]) -> None:
        self.stream, self.log_file, self._after_redraw = stream, log_file, False

    def write(self, data: str) -> int:
        redraw = "\r" in data
        # a logging handler made during the run may outlive it (in-process callers): the log is closed by then
        if not redraw and not (self._after_redraw and data == "\n") and not self.log_file.closed:
            self.log_file.write(ANSI_ESCAPE.sub("", data))  # colours a library adds for the terminal (Ray's prefixes)
        self._after_redraw = redraw
        return self.stream.write(data)

    def log_only(self, line: str) -> None:
        if not self.log_file.closed:
            self.log_file.write(line + "\n")

    def flush(self) -> None:
        if not self.log_file.closed:
            self.log_file.flush()
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # isatty(), fileno(), encoding ... of the real stream
        return getattr(self.stream, name)


@contextlib.contextmanager
def console_copied_to(path: Path) -> Iterator[None]:
    """Copy ``sys.stdout`` and ``sys.stderr`` to ``path`` (appended) while the block runs."""
    streams = sys.stdout, sys.stderr
    with open(path, "a", buffering=1) as log_file:
        sys.stdout, sys.stderr = ConsoleTee(sys.stdout, log_file), ConsoleTee(sys.stderr, log_file)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = streams


def report_step(progress: tqdm, step: int, max_steps: int, metrics: dict[str, float], loss_key: str) -> None:
    """Advance the progress bar and say the step as a plain line: on the console where no bar is drawn (stderr is
    not a terminal), else in ``console.log`` alone. ``loss_key``: the algorithm's loss metric
    (``Objective.loss_key``), named as such (``awm_loss 0.0123``)."""
    progress.update(1)
    reward, loss, seconds = metrics["env/avg"], metrics[f"train/actor/{loss_key}"], metrics["time/step"]
    progress.set_postfix({"reward": f"{reward:.3f}", loss_key: f"{loss:.4f}", "step_s": f"{seconds:.1f}"})
    line = f"[step {step}/{max_steps}] reward {reward:.3f}, {loss_key} {loss:.4f}, {seconds:.1f} s/step"
    if progress.disable:
        tqdm.write(line, file=sys.stderr)
    elif isinstance(sys.stderr, ConsoleTee):
        sys.stderr.log_only(line)


def command_prefix(module: str) -> str:
    """How the user's shell runs ``rlrunner.<module>`` with no environment active: ``bin/rlrunner <module>``, relative
    from the repository root (where the launcher was started, ``RLRUNNER_CALLER_CWD``), else absolute. An installed
    package has no wrapper; its environment is the user's own, active one."""
    wrapper = REPO_DIR / "bin" / "rlrunner"
    if not wrapper.is_file():
        return "tensorboard" if module == "tensorboard" else f"python -m rlrunner.commands.{module}"
    caller = Path(os.environ.get("RLRUNNER_CALLER_CWD") or os.getcwd()).resolve()
    return f"{'bin/rlrunner' if caller == REPO_DIR else shlex.quote(str(wrapper))} {module}"


def eval_line(step: int, num_prompts: int, model_cfg: Any) -> str:
    """Said before an eval starts (the first one, at step 0, can take minutes with no other sign of life)."""
    family = model_cfg[model_cfg.model_type]
    return (f"[step {step}] eval: {num_prompts} held-out prompts, one sample each, {family.eval_num_steps} "
            f"{family.eval_sampler} steps")


def watch_lines(log_dir: Path) -> list[str]:
    """The summary's lines on the reward-hacking watch: each alarm of the run (its :data:`WATCH_FILE`)."""
    path = log_dir / WATCH_FILE
    alarms = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [f"  reward hacking?  the watch's alarm fired at step {a['step']}: guard {a['guard']} "
            f"{a['first']:.4f} -> {a['now']:.4f}; samples: {a['samples']} (docs/reward_hacking.md)" for a in alarms]


def run_summary(log_dir: Path, steps: int, seconds: float, tensorboard: bool, checkpoints: list[Path]) -> str:
    """A few lines for the console: held-out reward at the first and last eval of the run (its metrics.jsonl),
    each alarm of the reward-hacking watch (:func:`watch_lines`), steps, wall time, the checkpoint and TensorBoard
    folders and the commands (:func:`command_prefix`) that open TensorBoard and export the newest of the run's
    complete ``checkpoints``."""
    metrics = log_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    evals = [(r["step"], r["eval/avg"]) for r in records if r.get("eval/avg") is not None]  # null: NaN
    minutes, secs = divmod(round(seconds), 60)
    lines = [f"rlrunner: done: {steps} step(s) in {minutes}m{secs:02d}s; logs in {log_dir}"]
    if evals:
        (first_step, first), (last_step, last) = evals[0], evals[-1]
        change = f" ({last - first:+.4f})" if last_step != first_step else ""
        lines.append(f"  held-out reward: {first:.4f} at step {first_step} -> {last:.4f} at step {last_step}{change}")
    lines += watch_lines(log_dir)
    if tensorboard:
        events = shlex.quote(str(log_dir / "tensorboard"))
        lines.append(f"  TensorBoard:     {command_prefix('tensorboard')} --logdir {events}")
    if checkpoints:
        lines.append(f"  checkpoints:     {checkpoints[-1].parent}")
        lines.append(f"  export the LoRA: {command_prefix('export')} {shlex.quote(str(checkpoints[-1]))} --out "
                     f"{shlex.quote(str(log_dir / 'lora'))}")
    return "\n".join(lines)
