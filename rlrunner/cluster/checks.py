"""The checks of the cluster's keys (``cluster.*``), registered in :mod:`rlrunner.recipe`. How batches, prompts and
context-parallel groups share the placed devices is checked with the placement, by
:func:`rlrunner.step.checks.check_placement`."""

from __future__ import annotations

from rlrunner.cluster.factory import BACKENDS
from rlrunner.config.check_kinds import POSITIVE_INT, Check, Choice, Elsewhere, Free, Range, names
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
}
