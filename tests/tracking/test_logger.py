"""Sample grids a person can read: the split and step in the image, and under each sample its target, what the OCR
read and the reward."""

from __future__ import annotations

import numpy as np
import pytest
from runner_helpers import small_recipe

from rlrunner.rewards import RewardOutput
from rlrunner.run.runner import run
from rlrunner.tracking.logger import RunLogger, caption_lines, sample_grid


def test_caption_lines_give_target_reading_and_reward():
    assert caption_lines('a sign that says "2345"', 0.75, "2346", 40) == ["target: '2345'", "read: '2346'",
                                                                          "reward: 0.75"]
    assert caption_lines("no quotes here at all, a long prompt", 0.5, None, 12) == ["target: 'no ", "reward: 0.50"]


def _ink(grid: np.ndarray, rows: slice) -> int:
    return int((grid[rows] < 128).any(axis=-1).sum())


def test_grid_draws_title_and_reading_lines():
    images = np.full((2, 32, 96, 3), 255, dtype=np.uint8)  # blank: every dark pixel is text
    prompts = ['a sign that says "2345"', 'a sign that says "678"']
    rewards = np.array([0.75, 1.0])
    plain = sample_grid(images, prompts, rewards)
    grid = sample_grid(images, prompts, rewards, title="train samples, step 20", texts=["2346", "678"])
    tile_h = 32 * 4  # enlarged 4x: 128 // 32
    assert plain.shape == (tile_h + 2 * 12 + 4, 2 * 96 * 4, 3)
    assert grid.shape == (18 + tile_h + 3 * 12 + 4, 2 * 96 * 4, 3)
    assert _ink(plain, slice(0, 18)) == 0 and _ink(grid, slice(0, 18)) > 0  # the title line
    reading = slice(18 + tile_h + 2 + 12, 18 + tile_h + 2 + 24)  # the second caption line: what was read
    assert _ink(grid, reading) > 0
    other = sample_grid(images, prompts, rewards, title="train samples, step 20", texts=["9999", "678"])
    assert not np.array_equal(grid[reading], other[reading])


def test_recognised_texts_take_the_first_frame_and_a_multi_rewards_ocr_part():
    video = RewardOutput(avg=np.zeros((2, 2), np.float32), extra={"texts": [["12", "13"], []]})
    assert video.recognised_texts() == ["12", ""]
    multi = RewardOutput(avg=np.zeros(2, np.float32), extra={"ocr/texts": ["5", "6"], "error_reasons": {}})
    assert multi.recognised_texts() == ["5", "6"]
    assert RewardOutput(avg=np.zeros(2, np.float32)).recognised_texts() is None


@pytest.mark.ocr
def test_the_runner_hands_the_grid_what_the_ocr_read(tmp_path, monkeypatch):
    pytest.importorskip("rapidocr")
    grids = []
    original = RunLogger.samples

    def recording(self, tag, images, prompts, rewards, step, texts=None):
        grids.append((tag, step, len(images), texts))
        return original(self, tag, images, prompts, rewards, step, texts=texts)

    monkeypatch.setattr(RunLogger, "samples", recording)
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    run(small_recipe(tmp_path, "runner.max_steps=1", "runner.save_interval=0", "runner.val_check_interval=0",
                     "env.train.reward.model=ocr", "env.eval.reward.model=ocr"), log_dir)
    assert [(tag, step, n) for tag, step, n, _ in grids] == [("eval/samples", 0, 4), ("train/samples", 1, 4)]
    assert all(isinstance(texts, list) and len(texts) == 4 and all(isinstance(t, str) for t in texts)
               for *_, texts in grids)
    assert (log_dir / "samples" / "train_samples_step000001.png").is_file()


def test_metrics_jsonl_is_strict_json_with_null_for_nan_and_inf(tmp_path):
    """jq and JSON.parse reject NaN/Infinity: a non-finite scalar is written as null, the finite ones as they are."""
    import json
    import math

    from rlrunner.config.schema import LoggerConfig

    run_logger = RunLogger(tmp_path, LoggerConfig(logger_backends=[]))
    run_logger.scalars({"train/loss": math.nan, "train/grad_norm": math.inf, "env/avg": -math.inf, "lr": 0.25}, 3)
    run_logger.close()

    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line, parse_constant=refuse) == {"step": 3, "train/loss": None, "train/grad_norm": None,
                                                       "env/avg": None, "lr": 0.25}
