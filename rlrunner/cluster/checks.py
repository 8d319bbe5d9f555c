"""The checks of the cluster's keys (``cluster.*``, the actor's parallel engine, context-parallel sizes and mode),
and the checks that need the placement: how batches, prompts and context-parallel groups share the placed devices.
Registered in :mod:`rlrunner.recipe`, which runs :func:`check_placement` before launch when the devices are
known offline; :class:`rlrunner.run.runner.Runner` runs it again after joining a Ray cluster."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from rlrunner.cluster.context_parallel import CP_MODES
from rlrunner.cluster.factory import BACKENDS
from rlrunner.cluster.parallelize import ENGINES
from rlrunner.cluster.placement import parse_placement
from rlrunner.cluster.resources import detect_devices_per_node
from rlrunner.config.check_kinds import POSITIVE_INT, Check, Choice, Context, Elsewhere, Free, Range, names
from rlrunner.config.errors import fail as _fail
from rlrunner.config.paths import joins_cluster
from rlrunner.utils.threads import ENV_THREADS

KEY_CHECKS: dict[str, Check] = {
    "cluster.num_nodes": POSITIVE_INT,
    "cluster.num_devices_per_node": Range(low=0, meaning="0 = detect"),
    "cluster.component_placement": Elsewhere("check_placement (parse_placement with the node and device counts)"),
    "cluster.backend": Choice(names(BACKENDS)),
    "cluster.ray_address": Free("'auto', host:port or empty; Ray reports an unreachable address when it connects"),
    "cluster.ship_code": Free("bool"),
    "cluster.cpus_per_worker": Range(low=0, low_open=True),
    "cluster.env_threads": Choice(names(ENV_THREADS)),
    "cluster.worker_timeout_s": Range(low=0, low_open=True, meaning="seconds"),
    "cluster.rejoin_timeout_s": Range(low=0, meaning="seconds"),
    "cluster.enable_offload": Free("bool"),
    "actor.strategy": Choice(names(ENGINES)),
    "actor.one_rank_group": Free("bool"),
    "actor.context_parallel_size": POSITIVE_INT,  # and the model's heads and tokens (models.checks)
    "actor.context_parallel_mode": Choice(names(CP_MODES)),
    "rollout.context_parallel_size": POSITIVE_INT,
}


def _check_batches(cfg: DictConfig, num_actor_workers: int) -> None:
    actor = cfg.actor
    cp = actor.context_parallel_size
    if num_actor_workers % cp:
        _fail(f"actor.context_parallel_size={cp} does not divide the {num_actor_workers} actor devices into whole "
              f"context-parallel groups")
    groups = num_actor_workers // cp  # a context-parallel group trains the same samples on all its devices
    step = actor.micro_batch_size * groups
    if actor.global_batch_size % step:
        _fail(f"actor.global_batch_size={actor.global_batch_size} is not divisible by actor.micro_batch_size="
              f"{actor.micro_batch_size} x {groups} actor worker group(s) = {step}")
    samples = cfg.env.train.total_num_envs * cfg.env.train.rollout_epoch
    if samples % actor.global_batch_size:
        _fail(f"one step rolls out env.train.total_num_envs x rollout_epoch = {samples} samples, not a multiple "
              f"of actor.global_batch_size={actor.global_batch_size}")


def check_offline_placement(cfg: DictConfig, ctx: Context) -> None:
    """:func:`check_placement` before launch, when the devices are known offline (else after connecting)."""
    if _devices_known_offline(cfg.cluster):
        try:
            placement = parse_placement(cfg.cluster.component_placement, cfg.cluster.num_nodes,
                                        detect_devices_per_node(cfg.cluster))
        except (ValueError, TypeError) as err:
            _fail(str(err))
        check_placement(cfg, placement)


def _devices_known_offline(cluster: DictConfig) -> bool:
    """False when the recipe joins an existing Ray cluster and leaves its devices per node to detection: then
    the driver machine's devices say nothing, and the placement is checked after connecting (runner.run)."""
    return not joins_cluster(cluster) or cluster.num_devices_per_node > 0


def check_placement(cfg: DictConfig, placement: Any) -> None:
    """Checks that need the placement (a :class:`~rlrunner.cluster.Placement`): batch and prompt shares."""
    _check_batches(cfg, placement.num_workers("actor"))
    if cfg.runner.rollout_ahead and cfg.cluster.enable_offload and placement.is_collocated("actor", "rollout"):
        _fail("runner.rollout_ahead=true needs the actor and rollout models on the device at the same time; it "
              "cannot be combined with cluster.enable_offload for collocated actor and rollout")
    prompts_per_epoch = cfg.env.train.total_num_envs // cfg.algorithm.group_size
    rollout_cp, rollout_devices = cfg.rollout.context_parallel_size, placement.num_workers("rollout")
    if rollout_devices % rollout_cp:
        _fail(f"rollout.context_parallel_size={rollout_cp} does not divide the {rollout_devices} rollout devices into "
              f"whole groups")
    shards = rollout_devices // rollout_cp  # a rollout group samples one shard together
    if prompts_per_epoch % shards:
        _fail(f"env.train.total_num_envs / algorithm.group_size = {prompts_per_epoch} prompts per rollout epoch "
              f"cannot be shared evenly by {shards} rollout worker group(s)")
    # held-out prompts are shared unevenly when they must be (Runner: _split), but every worker needs one
    if cfg.env.eval.total_num_envs < shards:
        _fail(f"env.eval.total_num_envs={cfg.env.eval.total_num_envs} is fewer than the {shards} rollout worker "
              f"group(s); evaluate at least one prompt per group")
