"""Every local path of a recipe made absolute on the driver, before any worker sees it.

Workers run on other nodes in other working directories (README "Clusters"), so a relative path means
nothing there. Keys that are always local paths are anchored at the driver's working directory; a model or
LoRA path is anchored only when it names a local folder (a hub id ``org/name`` stays as it is).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rlrunner.config.checks import family_sections, leaves, table_key

# keys (as rlrunner.config.checks.KEY_CHECKS names them) whose value, when set, is a local file or folder
PATH_KEYS = (
    "runner.logger.log_path",
    "runner.resume_dir",
    "env.<split>.dataset.path",
    "env.<split>.reward.token_file",
    "env.<split>.reward.api_key_file",
    "env.<split>.reward.head_path",
    "env.<split>.video_cfg.video_base_dir",
)
# a local folder or a hub id
MODEL_KEYS = ("actor.model.model_path", "actor.model.<family>.lora_path", "env.<split>.reward.model_path",
              "env.<split>.reward.processor_path")
# the same keys of the parts of a multi reward (env.<split>.reward.rewards[i]): local paths, local or hub id
REWARD_PART_PATH_KEYS = ("token_file", "api_key_file", "head_path")
REWARD_PART_MODEL_KEYS = ("model_path", "processor_path")
NOT_A_PATH = ("", "auto")  # unset, and runner.resume_dir's "newest checkpoint of this recipe"


def is_local_path(value: str, base_dir: Path) -> bool:
    """Whether a model/LoRA path names a local folder rather than a hub id ``org/name``."""
    return (value.startswith((".", "/", "~")) or (base_dir / Path(value).expanduser()).exists()
            or value.count("/") != 1)


def absolute(value: str, base_dir: Path) -> str:
    """``value`` anchored at ``base_dir`` (``~`` expanded, ``..`` folded; symlinks kept as the user named them)."""
    return os.path.normpath(base_dir / Path(value).expanduser())


def make_paths_absolute(cfg: DictConfig, base_dir: Path) -> None:
    """Rewrite, in place, every local path of ``cfg`` (a merged, validated recipe) as an absolute path."""
    families = family_sections(cfg)
    for dotted, value in list(leaves(cfg)):
        key = table_key(dotted, families)
        if not isinstance(value, str) or value in NOT_A_PATH:
            continue
        if key in PATH_KEYS or (key in MODEL_KEYS and is_local_path(value, base_dir)):
            OmegaConf.update(cfg, dotted, absolute(value, base_dir))
    for split in cfg.env:
        for part in cfg.env[split].reward.rewards:
            _absolute_part(part, base_dir)


def _absolute_part(part: Any, base_dir: Path) -> None:
    for key in (*REWARD_PART_PATH_KEYS, *REWARD_PART_MODEL_KEYS):
        value = part.get(key, "")
        if not isinstance(value, str) or value in NOT_A_PATH:
            continue
        if key in REWARD_PART_PATH_KEYS or is_local_path(value, base_dir):
            part[key] = absolute(value, base_dir)
