"""The checks that need the placement: the step's sizes on the placed devices (:class:`~rlrunner.step.sizes.StepSizes`
refuses those that do not divide) and the components' turns on shared devices. :mod:`rlrunner.recipe` runs
:func:`check_offline_placement` before launch, where the devices are known offline; the runner runs
:func:`check_placement` again after joining a Ray cluster, whose devices may differ."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from rlrunner.cluster.placement import parse_placement
from rlrunner.cluster.resources import detect_devices_per_node
from rlrunner.config.check_kinds import Context
from rlrunner.config.errors import fail
from rlrunner.config.paths import joins_cluster
from rlrunner.step.sizes import StepSizes


def check_offline_placement(cfg: DictConfig, ctx: Context) -> None:
    """:func:`check_placement` before launch, when the devices are known offline (else after connecting)."""
    if _devices_known_offline(cfg.cluster):
        try:
            placement = parse_placement(cfg.cluster.component_placement, cfg.cluster.num_nodes,
                                        detect_devices_per_node(cfg.cluster))
        except (ValueError, TypeError) as err:
            fail(str(err))
        check_placement(cfg, placement)


def _devices_known_offline(cluster: DictConfig) -> bool:
    """False when the recipe joins an existing Ray cluster and leaves its devices per node to detection: then
    the driver machine's devices say nothing, and the placement is checked after connecting (runner.run)."""
    return not joins_cluster(cluster) or cluster.num_devices_per_node > 0


def check_placement(cfg: DictConfig, placement: Any) -> StepSizes:
    """The step's sizes on ``placement`` (a :class:`~rlrunner.cluster.Placement`), checked, and the turns that
    collocated components take; returns the sizes."""
    sizes = StepSizes.of(cfg, placement)
    if cfg.runner.rollout_ahead and cfg.cluster.enable_offload and placement.is_collocated("actor", "rollout"):
        fail("runner.rollout_ahead=true needs the actor and rollout models on the device at the same time; it "
             "cannot be combined with cluster.enable_offload for collocated actor and rollout")
    return sizes
