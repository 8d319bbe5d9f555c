"""The OCR engine failing for some batches (raising, hanging past ``reward.timeout_s``, returning garbage): those
images score 0 and are counted, the rest are scored; an engine failing on every image stops a run after
``runner.max_reward_error_steps`` steps with one line."""

from __future__ import annotations

import threading
import time
from typing import ClassVar

import numpy as np
import pytest
from reward_helpers import coded_image
from runner_helpers import SMALL_OVERRIDES, make_assets, train_metrics

from rlrunner.commands.train import EXIT_REWARD_UNAVAILABLE, main
from rlrunner.rewards import build_reward
from rlrunner.rewards.ocr.engines import ENGINES, Line, OcrEngine

GOOD, RAISES, HANGS, GARBAGE = 11, 12, 13, 14  # the code pixel of an image tells the engine how to fail
HANG_S = 3.0  # how long a hung call lasts (it ends, so no thread outlives the test for long)


class FaultyEngine(OcrEngine):
    """Reads every image as "2345" unless a code pixel (or ``FaultyEngine.mode`` for whole runs) says to fail."""

    name = "faulty"
    mode: ClassVar[str] = "by_code"  # by_code | hang_every_other_call | hang_always
    calls: ClassVar[list[int]] = []
    release = threading.Event()

    def __init__(self, **kwargs) -> None:
        pass

    def read(self, images: list[np.ndarray]) -> list[list[Line]]:
        FaultyEngine.calls.append(len(images))
        codes = [int(image[0, 0, 0]) for image in images]
        hang = {"hang_always": True, "hang_every_other_call": len(FaultyEngine.calls) % 2 == 0}.get(
            self.mode, HANGS in codes)
        if hang:
            FaultyEngine.release.wait(HANG_S)
        if RAISES in codes:
            raise RuntimeError("simulated engine crash")
        if GARBAGE in codes:
            return [None if code == GARBAGE else [("2345", 0.9)] for code in codes]  # not a list of lines
        return [[("2345", 0.9)] for _ in images]

    def read_lines(self, images: list[np.ndarray]) -> list[Line]:
        return [lines[0] for lines in self.read(images)]


@pytest.fixture
def faulty_engine(monkeypatch):
    monkeypatch.setitem(ENGINES, "faulty", FaultyEngine)
    monkeypatch.setattr(FaultyEngine, "mode", "by_code")
    FaultyEngine.calls.clear()
    FaultyEngine.release.clear()
    yield FaultyEngine
    FaultyEngine.release.set()  # let hung calls end


def test_failing_batches_score_zero_and_are_counted_the_rest_is_scored(faulty_engine):
    reward = build_reward({"model": "ocr", "engine": "faulty", "batch_size": 2, "timeout_s": 0.5})
    codes = [GOOD, GOOD, HANGS, GOOD, RAISES, GOOD, GARBAGE, GOOD]
    images = np.stack([coded_image(code) for code in codes])
    start = time.monotonic()
    out = reward(images, ['a sign that says "2345"'] * len(codes))
    assert time.monotonic() - start < HANG_S  # the hung call was abandoned after 0.5 s
    # batches of 2: [GOOD, GOOD] scored; [HANGS, GOOD] timed out whole; [RAISES, GOOD] and [GARBAGE, GOOD] are
    # retried image by image, so only the failing image of each scores 0
    np.testing.assert_array_equal(out.avg, [1, 1, 0, 0, 0, 1, 0, 1])
    assert out.errors == 4 and not out.failure
    reasons = out.extra["image_errors"]
    assert reasons[2] == reasons[3] == "engine timeout: no answer within reward.timeout_s=0.5 s"
    assert reasons[4] == "engine error: RuntimeError: simulated engine crash"
    assert reasons[6].startswith("engine error: TypeError")


def test_an_engine_hanging_on_every_image_is_a_failure(faulty_engine):
    reward = build_reward({"model": "ocr", "engine": "faulty", "batch_size": 4, "timeout_s": 0.2})
    out = reward(np.stack([coded_image(HANGS)] * 4), ['a sign that says "2345"'] * 4)
    assert out.errors == 4 and out.avg.tolist() == [0, 0, 0, 0]
    assert out.failure == "all 4 images were unscorable; the last one: engine timeout: no answer within " \
                          "reward.timeout_s=0.2 s"


def _train(root, *extra: str) -> int:
    model, data = make_assets(root)
    options = [*SMALL_OVERRIDES, f"actor.model.model_path={model}", f"env.train.dataset.path={data}",
               f"env.eval.dataset.path={data}", f"runner.logger.log_path={root / 'logs'}",
               "runner.val_before_train=false", "runner.val_check_interval=0", "runner.save_interval=0",
               "runner.async_reward=false", "env.train.reward.model=ocr", "env.train.reward.engine=faulty",
               "env.train.reward.batch_size=4", "env.train.reward.timeout_s=0.3", *extra]
    return main(["--config-name", "tiny_nft_ocr", "--log-dir", str(root / "run"), *options])


@pytest.mark.slow
def test_a_run_goes_on_through_hung_batches_and_stops_when_every_image_fails(faulty_engine, tmp_path, capsys,
                                                                           monkeypatch):
    # every other engine call hangs: half of each step's 8 images score 0 and are counted; the run finishes
    monkeypatch.setattr(FaultyEngine, "mode", "hang_every_other_call")
    assert _train(tmp_path / "flaky", "runner.max_steps=2") == 0
    metrics = train_metrics(tmp_path / "flaky" / "run")
    assert [m["step"] for m in metrics] == [1, 2]
    assert [m["env/reward_errors"] for m in metrics] == [4, 4]
    # every call hangs: two steps without a scored sample stop the run with one line
    monkeypatch.setattr(FaultyEngine, "mode", "hang_always")
    capsys.readouterr()
    assert _train(tmp_path / "down", "runner.max_steps=4", "runner.max_reward_error_steps=2") == \
        EXIT_REWARD_UNAVAILABLE
    assert [m["step"] for m in train_metrics(tmp_path / "down" / "run")] == [1]
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlrunner: error:")]
    assert errors == [("rlrunner: error: no training sample could be scored in 2 step(s) in a row "
                       "(runner.max_reward_error_steps=2): all 8 images were unscorable; the last one: engine "
                       "timeout: no answer within reward.timeout_s=0.3 s")]


def test_hung_calls_are_counted_and_engines_are_rebuilt_at_most_max_engine_rebuilds_times(faulty_engine,
                                                                                          monkeypatch):
    from rlrunner.rewards import RewardUnavailable

    monkeypatch.setattr(FaultyEngine, "mode", "hang_always")
    reward = build_reward({"model": "ocr", "engine": "faulty", "batch_size": 1, "timeout_s": 0.1,
                           "max_engine_rebuilds": 2})
    prompts = ['a sign that says "2345"']
    for built in (1, 2, 3):  # the first engine hangs, then two rebuilt ones: each call's image scores 0
        assert reward(coded_image(GOOD)[None], prompts).errors == 1
        assert (reward.engines.built, reward.engines.timeouts, reward.engines.rebuilds) == (built, built, built - 1)
    with pytest.raises(RewardUnavailable, match=r"hung 3 time\(s\) past reward.timeout_s=0.1 s and was rebuilt 2 "
                                                r"time\(s\), the most reward.max_engine_rebuilds=2 allows"):
        reward(coded_image(GOOD)[None], prompts)


@pytest.mark.slow
def test_a_run_whose_engine_keeps_hanging_stops_with_one_line_at_the_rebuild_limit(faulty_engine, tmp_path, capsys,
                                                                                   monkeypatch):
    # 2 engine calls per step, each hanging: step 1 uses the first engine and one rebuild; step 2 needs a second
    monkeypatch.setattr(FaultyEngine, "mode", "hang_always")
    capsys.readouterr()
    assert _train(tmp_path, "runner.max_steps=4", "runner.max_reward_error_steps=10",
                  "env.train.reward.max_engine_rebuilds=1") == EXIT_REWARD_UNAVAILABLE
    assert [m["step"] for m in train_metrics(tmp_path / "run")] == [1]
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlrunner: error:")]
    assert len(errors) == 1 and "reward.max_engine_rebuilds=1" in errors[0] and "rebuilt 1 time(s)" in errors[0]
