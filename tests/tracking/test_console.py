"""The console: a progress bar on a terminal, plain lines in console.log, and closing commands that work where the
user's shell is."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import select
import shlex
import struct
import subprocess
import sys
import termios

from runner_helpers import SMALL_OVERRIDES, make_assets
from shell_helpers import clean_env
from tqdm import tqdm

from rlrunner.config.paths import REPO_DIR as REPO_ROOT
from rlrunner.tracking.console import ConsoleTee, command_prefix, report_step


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_log_gets_plain_lines_and_the_terminal_the_bar():
    terminal, log = Terminal(), io.StringIO()
    stderr = ConsoleTee(terminal, log)
    stderr.write("rlrunner: logging to x\n")
    stderr.write("\rtrain:  50%|#####     | 1/2")
    stderr.write("\n")  # the newline that closes a bar
    stderr.write("[step 0] eval reward 0.5\n")
    stderr.write("\x1b[36m(RewardWorker pid=7)\x1b[0m ready\n")  # a coloured prefix, as Ray writes on a terminal
    assert log.getvalue() == "rlrunner: logging to x\n[step 0] eval reward 0.5\n(RewardWorker pid=7) ready\n"
    assert terminal.getvalue().count("\r") == 1


def test_a_drawn_bar_still_leaves_each_step_as_a_line_in_the_log(monkeypatch):
    terminal, log = Terminal(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", ConsoleTee(terminal, log))
    progress = tqdm(total=2, file=sys.stderr, disable=not sys.stderr.isatty())
    metrics = {"env/avg": 0.5, "train/actor/awm_loss": -0.0012, "time/step": 6.6}
    report_step(progress, 1, 2, metrics, "awm_loss")
    progress.close()
    assert "\r" in terminal.getvalue() and "awm_loss=-0.0012" in terminal.getvalue()  # the bar, with its loss named
    assert log.getvalue() == "[step 1/2] reward 0.500, awm_loss -0.0012, 6.6 s/step\n"


def test_closing_commands_are_relative_from_the_repository_root_else_absolute(monkeypatch, tmp_path):
    monkeypatch.setenv("RLRUNNER_CALLER_CWD", str(REPO_ROOT))
    assert command_prefix("export") == "bin/rlrunner export"
    monkeypatch.setenv("RLRUNNER_CALLER_CWD", str(tmp_path))
    assert command_prefix("tensorboard") == f"{REPO_ROOT / 'bin' / 'rlrunner'} tensorboard"


def test_on_a_terminal_the_launched_run_draws_its_bar_and_console_log_stays_plain(tmp_path):
    """bin/rlrunner train -> the launcher -> the run, on a pseudo-terminal as in an interactive shell."""
    model, data = make_assets(tmp_path)
    overrides = [*SMALL_OVERRIDES, f"actor.model.model_path={model}", f"env.train.dataset.path={data}",
                 f"env.eval.dataset.path={data}", "runner.max_steps=2", "runner.val_check_interval=0",
                 "runner.save_interval=0", "runner.sample_log_interval=0"]
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal 120 columns wide
    command = ["bin/rlrunner", "train", "tiny_nft_ocr", *overrides]
    env = {**clean_env(), "RLRUNNER_LOG_ROOT": str(tmp_path / "logs")}
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdin=child, stdout=child, stderr=child)
    os.close(child)
    seen = b""
    while True:  # read the terminal until the process closes it
        ready, _, _ = select.select([main], [], [], 120)
        try:
            chunk = os.read(main, 65536) if ready else b""
        except OSError:  # EIO: the child side is closed
            chunk = b""
        if not chunk:
            break
        seen += chunk
    assert process.wait(timeout=60) == 0, seen.decode(errors="replace")[-3000:]
    screen = seen.decode(errors="replace")
    assert "\rtrain: 100%" in screen and "nft_loss=" in screen  # tqdm drew and redrew its bar
    (log_dir,) = (tmp_path / "logs").iterdir()
    console = (log_dir / "console.log").read_text()
    assert console.startswith(f"rlrunner: logging to {log_dir}\n") and "\r" not in console
    assert "[step 1/2] reward " in console and "[step 2/2] reward " in console and ", nft_loss " in console
    assert "rlrunner: done: 2 step(s)" in console
    typed, recipe = (log_dir / "command.txt").read_text().splitlines()
    assert shlex.split(typed) == command and recipe == "# recipe: tiny_nft_ocr"  # as typed, then the recipe
