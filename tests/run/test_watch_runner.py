"""The reward-hacking watch around its math (tests/algorithms/test_watch.py; its keys' checks:
tests/config/test_watch_keys.py): the guards scored beside the eval reward on an env worker, and the driver's watch:
metrics, one line per failing guard, the alarm's line, samples, summary and stop."""

import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlrunner.recipe import RecipeConfig
from rlrunner.rewards import RewardOutput, build_reward
from rlrunner.run.watch import Watch, WatchStopped
from rlrunner.step.batch import Batch
from rlrunner.tracking.console import run_summary
from rlrunner.tracking.logger import RunLogger
from rlrunner.workers.guards import FEATURES, GUARD_ERRORS, WatchedReward, build_guards


def _dead_service_guard(name: str, required: bool):
    # a reward service that is down: connection refused at once, no retries; required: the reward refuses to start,
    # else it scores every sample as failed
    return {"name": name, "model": "remote", "url": "http://127.0.0.1:9", "max_retries": 0, "timeout_s": 2,
            "required": required}


def test_guards_score_beside_the_eval_reward_and_a_failing_one_is_left_out():
    watch = OmegaConf.create({"guards": [{"name": "texture", "model": "image_stats"},
                                         _dead_service_guard("at_start", True), _dead_service_guard("judge", False)]})
    reward = WatchedReward(build_reward({"model": "jpeg_compressibility"}), build_guards(watch), features=True)
    images = np.random.default_rng(0).integers(0, 255, (4, 32, 32, 3), dtype=np.uint8)
    plain = build_reward({"model": "jpeg_compressibility"})(images, ["a"] * 4)
    for _ in range(2):  # the second call does not ask the dead service again
        out = reward(images, ["a"] * 4)
        assert np.array_equal(out.avg, plain.avg)  # a guard never changes the eval reward
        assert out.extra["guard/texture"].shape == (4,) and out.extra[FEATURES].shape == (4, 768)
        assert "guard/judge" not in out.extra and "guard/at_start" not in out.extra
        assert [line.split(":")[0] for line in out.extra[GUARD_ERRORS]] == ["at_start", "judge"]
    assert "RewardUnavailable: reward.model=remote (required) cannot reach its service" in out.extra[GUARD_ERRORS][0]


def _cfg(**watch):
    cfg = OmegaConf.structured(RecipeConfig)
    cfg.env.train.reward.model = "jpeg_compressibility"
    cfg.runner.watch.update({"window": 2, "min_reward_rise": 0.05, **watch})
    return cfg


def _eval_output(level: float, spread: int, errors: list[str]) -> RewardOutput:
    """An eval's output of 4 samples: eval reward ``level``, images ``spread`` grey levels apart."""
    images = torch.tensor([0, spread, 2 * spread, 3 * spread], dtype=torch.uint8)[:, None, None, None]
    from rlrunner.algorithms.watch import sample_features

    features = sample_features(images.expand(-1, 8, 8, 3)).numpy()
    return RewardOutput(np.full(4, level, np.float32), extra={FEATURES: features, GUARD_ERRORS: errors})


def _logged(n: int = 2) -> Batch:
    return Batch({"images": torch.zeros(n, 8, 8, 3, dtype=torch.uint8)}, {"prompts": ["p"] * n})


def test_the_watch_logs_its_metrics_reports_a_failing_guard_once_and_fires_on_a_gamed_run(tmp_path, capsys):
    run_logger = RunLogger(tmp_path, OmegaConf.structured(RecipeConfig).runner.logger)
    watch = Watch(_cfg(action="stop"), tmp_path)
    assert watch.builtin == ["eval_reward", "diversity"]
    first = watch.at_eval(0, _eval_output(0.76, 80, ["judge: RewardUnavailable: down"]), _logged(), run_logger)
    assert first == {"eval/diversity": 1.0, "watch/alarm": 0.0}
    for reward in (0.4, 0.45, 0.6, 0.8):
        watch.train_reward(reward)
    watch.stop_if_fired(4, None)  # no alarm yet: nothing happens
    later = watch.at_eval(4, _eval_output(0.02, 20, ["judge: RewardUnavailable: down"]), _logged(), run_logger)
    assert later["eval/diversity"] == pytest.approx(0.25) and later["watch/alarm"] == 1.0
    err = capsys.readouterr().err
    assert err.count("watch guard judge could not score (RewardUnavailable: down)") == 1
    (alarm,) = [line for line in err.splitlines() if "reward-hacking watch:" in line]
    assert "guard eval_reward fell 0.7600 -> 0.0200 since the first eval while the training reward rose 0.4250 -> " \
           "0.7000" in alarm
    samples = tmp_path / "samples" / "watch_alarm_samples_step000004.png"
    assert samples.is_file() and str(samples) in alarm
    with pytest.raises(WatchStopped, match="stopped the run after step 4 .*checkpoint saved to ckpt"):
        watch.stop_if_fired(4, lambda: "ckpt")
    # resumed in alarm, the run goes on: the alarm is still logged, but only a new one stops the run
    resumed = Watch(_cfg(action="stop"), tmp_path)
    resumed.load_state_dict(json.loads(json.dumps(watch.state_dict())))
    assert resumed.at_eval(8, _eval_output(0.02, 20, []), _logged(), run_logger)["watch/alarm"] == 1.0
    resumed.stop_if_fired(8, None)
    summary = run_summary(tmp_path, 4, 10.0, False, [])
    assert f"the watch's alarm fired at step 4: guard eval_reward 0.7600 -> 0.0200; samples: {samples}" in summary
    run_logger.close()


def test_an_honest_eval_keeps_the_alarm_off_and_a_disabled_watch_logs_nothing(tmp_path):
    run_logger = RunLogger(tmp_path, OmegaConf.structured(RecipeConfig).runner.logger)
    watch = Watch(_cfg(), tmp_path)
    watch.at_eval(0, _eval_output(0.70, 80, []), _logged(), run_logger)
    for reward in (0.4, 0.5, 0.6, 0.7):
        watch.train_reward(reward)
    assert watch.at_eval(4, _eval_output(0.75, 78, []), _logged(), run_logger)["watch/alarm"] == 0.0
    assert Watch(_cfg(enabled=False), tmp_path).at_eval(0, _eval_output(0.7, 80, []), _logged(), run_logger) == {}
    run_logger.close()
