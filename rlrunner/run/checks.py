"""The checks of the run's keys (``runner.*`` but its logger, and where a split's videos are saved), and across
keys: which changes a resumed run accepts, and the reward-hacking watch's guards (each a reward setting with a name,
checked as a reward's keys are). Registered in :mod:`rlrunner.recipe`."""

from __future__ import annotations

import re

from omegaconf import DictConfig, OmegaConf

from rlrunner.config.check_kinds import (
    COUNT,
    POSITIVE_INT,
    SEED,
    Check,
    Choice,
    Context,
    Elsewhere,
    Free,
    InPathTable,
    Range,
    fixed,
)
from rlrunner.config.errors import fail as _fail
from rlrunner.rewards.checks import reward_needs, reward_part_problems

# what the watch watches without a guard of that name: the eval reward and eval/diversity (rlrunner.run.watch)
BUILT_IN_GUARDS = ("eval_reward", "diversity")
GUARD_NAME = re.compile(r"[A-Za-z0-9_.-]+")

KEY_CHECKS: dict[str, Check] = {
    "runner.max_steps": Range(low=-1, meaning="-1 = unset; runner.max_steps or max_epochs must be positive"),
    "runner.max_epochs": Range(low=-1, meaning="-1 = unset; runner.max_steps or max_epochs must be positive"),
    "runner.val_check_interval": Range(low=-1, meaning="0 = never after step 0; -1 (RLinf) = never, also not before "
                                                       "training"),
    "runner.val_before_train": Free("bool"),
    "runner.save_interval": Range(low=-1, meaning="0 = only at the end; -1 (RLinf) = never"),
    "runner.keep_last_n": Range(low=0, meaning="0 = keep all"),
    "runner.resume_dir": InPathTable("a checkpoint or run folder, or auto"),
    "runner.resume_allow_changes": Elsewhere("check_resume (true, false or a list of dotted keys)"),
    "runner.log_dir": InPathTable("set by the launcher"),
    "runner.weight_sync_interval": POSITIVE_INT,
    "runner.sample_log_interval": Range(low=0, meaning="0 = never"),
    "runner.num_logged_samples": COUNT,
    "runner.async_reward": Free("bool"),
    "runner.rollout_ahead": Free("bool"),
    "runner.max_nonfinite_steps": POSITIVE_INT,
    "runner.max_reward_error_steps": POSITIVE_INT,
    "runner.max_restarts": Range(low=0, meaning="0 = stop at the first lost worker"),
    "runner.save_on_signal": Free("bool"),
    "runner.seed": SEED,
    "runner.watch.enabled": Free("bool"),
    "runner.watch.guards": Elsewhere("check_watch (a list of reward settings, each with a name)"),
    "runner.watch.diversity": Free("bool"),
    "runner.watch.action": Choice(fixed("warn", "stop")),
    "runner.watch.max_drop": Range(low=0, high=1, low_open=True, meaning="a fraction of the guard's first value"),
    "runner.watch.min_reward_rise": Range(low=0, meaning="in the training reward's units"),
    "runner.watch.window": POSITIVE_INT,
    "env.<split>.video_cfg.save_video": Free("bool"),
    "env.<split>.video_cfg.video_base_dir": InPathTable("a folder, created when videos are saved"),
    "env.<split>.video_cfg.fps": POSITIVE_INT,
}


def check_resume(cfg: DictConfig, ctx: Context) -> None:
    allow = cfg.runner.resume_allow_changes
    if isinstance(allow, bool) or (OmegaConf.is_list(allow) and all(isinstance(key, str) for key in allow)):
        return
    _fail(f"runner.resume_allow_changes={allow!r} must be true, false or a list of dotted keys "
          "(e.g. [actor.optim.lr]) that may differ from the checkpoint's recipe")


def check_watch(cfg: DictConfig, ctx: Context) -> None:
    """Each guard of ``runner.watch.guards`` is a mapping with its own name (letters, digits, ``_.-``) and reward
    keys that pass the reward keys' checks (:func:`~rlrunner.rewards.checks.reward_part_problems`), with the keys
    its reward model cannot do without."""
    seen: set[str] = set()
    for i, guard in enumerate(cfg.runner.watch.guards):
        key = f"runner.watch.guards[{i}]"
        if not OmegaConf.is_dict(guard):
            _fail(f"{key}={guard!r} must be a mapping of reward keys with a name, e.g. {{name: contrast, "
                  f"model: image_stats}}")
        settings = OmegaConf.to_container(guard, resolve=True)
        name = settings.pop("name", None)
        if not isinstance(name, str) or not GUARD_NAME.fullmatch(name):
            _fail(f"{key}.name={name!r} must be a name of letters, digits, '_', '.' or '-' (it is logged as "
                  f"eval/guard/<name>)")
        if name in seen or name in BUILT_IN_GUARDS:
            _fail(f"{key}.name={name!r} is taken (by another guard, or one the watch has built in: "
                  f"{', '.join(BUILT_IN_GUARDS)}); give each guard its own name")
        seen.add(name)
        for problem in reward_part_problems(key, settings, ctx):
            _fail(problem)
        for needed in reward_needs(settings.get("model", "ocr")):
            if not settings.get(needed):
                _fail(f"{key}.{needed} is empty; reward.model={settings.get('model')} needs it (see README, Rewards)")
