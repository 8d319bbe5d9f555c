"""A recipe, loaded and checked before any worker starts: its whole schema (the model families' sections added to
:mod:`rlrunner.config.schema`'s) and every component's checks, registered in one place.

Each model family, in-tree or a plugin (:mod:`rlrunner.models.families`), declares the type of its section
``actor.model.<model_type>`` (``FlowModel.settings_type``, a :class:`~rlrunner.models.settings.FamilyConfig`):
:data:`ModelConfig` is ``actor.model`` with one section per family, and :data:`RecipeConfig` the schema holding it.

Each component checks the keys it reads, in its own ``checks.py``: a table of one check per key (``KEY_CHECKS``)
and the checks across keys. This module lists them in the order they run: every key on its own first, then the
checks across keys, then the placement's where the devices are known offline (a joined Ray cluster's are checked
after connecting: :func:`rlrunner.step.checks.check_placement`, called by the runner). The first problem stops
the recipe with :class:`~rlrunner.config.errors.RecipeError`, one line naming the key, the value and what to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, make_dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlrunner.cluster import checks as cluster_checks
from rlrunner.config import schema
from rlrunner.config.check_kinds import Check, Context, CrossCheck
from rlrunner.config.checks import problems
from rlrunner.config.errors import fail
from rlrunner.config.loader import CONFIG_DIR, merge_recipe
from rlrunner.config.paths import launch_dir
from rlrunner.data import checks as data_checks
from rlrunner.distributed import checks as distributed_checks
from rlrunner.models import checks as model_checks
from rlrunner.models.families import family_settings
from rlrunner.models.settings import FamilyConfig
from rlrunner.objectives import checks as objective_checks
from rlrunner.rewards import checks as reward_checks
from rlrunner.run import checks as run_checks
from rlrunner.step import checks as step_checks
from rlrunner.tracking import checks as tracking_checks
from rlrunner.workers import checks as worker_checks


def _with(name: str, base: type, fields: list[tuple[str, type]]) -> type:
    """Dataclass ``name``: ``base`` with ``fields`` (name, type) added or replaced, each defaulting to its type's."""
    return make_dataclass(name, [(key, kind, field(default_factory=kind)) for key, kind in fields], bases=(base,),
                          namespace={"__module__": __name__})


#: ``actor.model``: the model keys and one section per family, each holding the settings type its family declares. A
#: section is declared a FamilyConfig, so that any FamilyConfig may be assigned to it (as tests and tools do).
ModelConfig = make_dataclass(
    "ModelConfig",
    [(name, FamilyConfig, field(default_factory=settings)) for name, settings in family_settings().items()],
    bases=(schema.ModelKeys,), namespace={"__module__": __name__})
ActorConfig = _with("ActorConfig", schema.ActorConfig, [("model", ModelConfig)])
#: the schema a recipe is merged onto: :class:`rlrunner.config.schema.RecipeConfig` with the family sections
RecipeConfig = _with("RecipeConfig", schema.RecipeConfig, [("actor", ActorConfig)])

# the component whose code reads a key holds its check (tests/config/test_checks.py: each key in exactly one table)
KEY_TABLES: dict[str, Mapping[str, Check]] = {
    "cluster": cluster_checks.KEY_CHECKS,
    "distributed": distributed_checks.KEY_CHECKS,
    "run": run_checks.KEY_CHECKS,
    "tracking": tracking_checks.KEY_CHECKS,
    "objectives": objective_checks.KEY_CHECKS,
    "data": data_checks.KEY_CHECKS,
    "rewards": reward_checks.KEY_CHECKS,
    "workers": worker_checks.KEY_CHECKS,
    "models": model_checks.KEY_CHECKS,
}
KEY_CHECKS: dict[str, Check] = {key: check for table in KEY_TABLES.values() for key, check in table.items()}

# in the order they run: the first failing one names the recipe's problem
CROSS_KEY_CHECKS: tuple[CrossCheck, ...] = (
    objective_checks.check_algorithm,
    objective_checks.check_awm,
    run_checks.check_resume,
    run_checks.check_watch,
    model_checks.check_model,
    model_checks.check_model_family,
    objective_checks.check_flow_grpo,  # after the model's: it reads the guidance they resolved
    tracking_checks.check_logger,
    data_checks.check_prompt_sets,
    reward_checks.check_rewards,
    model_checks.check_model_sequence,
    step_checks.check_offline_placement,  # last: the shares of the placed devices, where they are known offline
)


def validate(cfg: DictConfig, base_dir: Path, check_datasets: bool = True) -> None:
    """Reject contradictory or impossible recipes; ``base_dir`` anchors relative paths.

    First every key on its own (:data:`KEY_CHECKS`), then the checks across keys (:data:`CROSS_KEY_CHECKS`).
    ``check_datasets=False`` skips the prompt files (``rlrunner.commands.plan`` sizes a run without reading prompts).
    """
    ctx = Context(base_dir=base_dir, check_datasets=check_datasets)
    for problem in problems(cfg, ctx, KEY_CHECKS):
        fail(problem)
    for check in CROSS_KEY_CHECKS:
        check(cfg, ctx)


def load_recipe(name: str, overrides: list[str] | None = None, config_dir: Path = CONFIG_DIR, *,
                check_datasets: bool = True) -> DictConfig:
    """Merge recipe ``name`` and ``overrides`` onto the schema, resolve interpolations and validate.

    ``check_datasets=False`` accepts a recipe whose prompt files are absent (for tools that read no prompts).

    Returns a struct-mode, read-only :class:`DictConfig` whose local paths are absolute
    (:mod:`rlrunner.config.paths`); raises :class:`~rlrunner.config.errors.RecipeError` on any user error.
    """
    cfg = merge_recipe(name, overrides, config_dir, schema_type=RecipeConfig, check_datasets=check_datasets)
    model_checks.resolve_model_type(cfg, base_dir=launch_dir())
    validate(cfg, base_dir=launch_dir(), check_datasets=check_datasets)
    OmegaConf.set_readonly(cfg, True)
    return cfg
