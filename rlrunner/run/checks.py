"""The checks of the run's keys (``runner.*`` but its logger, and where a split's videos are saved), and across
keys: which changes a resumed run accepts. Registered in :mod:`rlrunner.recipe`."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from rlrunner.config.check_kinds import COUNT, POSITIVE_INT, SEED, Check, Context, Elsewhere, Free, InPathTable, Range
from rlrunner.config.errors import fail as _fail

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
