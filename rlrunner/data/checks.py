"""The checks of the prompt-set keys (``env.<split>.dataset.*``, how many prompts a step rolls out) and across keys:
whole prompt groups, and each split's prompt file there, readable, with the key each record needs (GenEval
records where the split's reward is GenEval). Registered in :mod:`rlrunner.recipe`."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from rlrunner.config.check_kinds import POSITIVE_INT, Check, Choice, Context, Elsewhere, InPathTable, fixed
from rlrunner.config.errors import fail as _fail
from rlrunner.rewards.checks import check_geneval_records, reward_parts

KEY_CHECKS: dict[str, Check] = {
    "env.<split>.total_num_envs": POSITIVE_INT,
    "env.<split>.rollout_epoch": POSITIVE_INT,
    "env.<split>.dataset.type": Choice(fixed("ocr")),  # prompt files (rlrunner/data/prompts.py)
    "env.<split>.dataset.path": InPathTable("a prompt file or folder (its files: _check_env, with dataset.split)"),
    "env.<split>.dataset.split": Elsewhere("_check_env (<split>.txt, .jsonl or .parquet must exist in dataset.path)"),
    "env.<split>.dataset.prompt_key": Elsewhere("_check_env (each record of a .jsonl or .parquet dataset.path must "
                                                "have it)"),
}


def _check_env(cfg: DictConfig, split: str, base_dir: Path, check_datasets: bool) -> None:
    env = cfg.env[split]
    group_size = cfg.algorithm.group_size
    if split == "train" and env.total_num_envs % group_size:
        _fail(f"env.train.total_num_envs={env.total_num_envs} is not a multiple of algorithm.group_size="
              f"{group_size}; use e.g. {max(1, env.total_num_envs // group_size) * group_size}")
    if not check_datasets:
        return
    from rlrunner.data.prompts import FORMATS, load_prompt_set

    if not env.dataset.path:
        _fail(f"env.{split}.dataset.path is empty; set it to a directory with {env.dataset.split}.txt or a "
              f"{' / '.join(FORMATS)} file")
    path = base_dir / Path(env.dataset.path).expanduser()  # absolute, and there (rlrunner.config.paths)
    names = [f"{env.dataset.split}{suffix}" for suffix in FORMATS]
    if path.is_dir() and not any((path / name).is_file() for name in names):
        source = path / "SOURCE.md"
        hint = f"; {source} says where to get it" if source.is_file() else ""
        _fail(f"env.{split}.dataset.path={env.dataset.path!r} has no {' / '.join(names)} "
              f"(env.{split}.dataset.split={env.dataset.split!r}); found: "
              f"{sorted(p.name for p in path.iterdir() if p.suffix in FORMATS) or 'no prompt files'}{hint}")
    try:  # read here, so a malformed file stops the recipe before any worker starts
        prompts = load_prompt_set(path, env.dataset.split, env.dataset.prompt_key)
    except (ValueError, TypeError, ImportError) as err:
        _fail(f"env.{split}.dataset.path={env.dataset.path!r}: {err}")
    if any(part["model"] == "geneval" for _, part in reward_parts(cfg, split)):
        check_geneval_records(f"env.{split}.dataset.path={env.dataset.path!r}", prompts)


def check_prompt_sets(cfg: DictConfig, ctx: Context) -> None:
    """:func:`_check_env` of the training split, then of the held-out one."""
    _check_env(cfg, "train", ctx.base_dir, ctx.check_datasets)
    _check_env(cfg, "eval", ctx.base_dir, ctx.check_datasets)
