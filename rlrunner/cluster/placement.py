"""``cluster.component_placement``: which accelerators each component runs on.

RLinf syntax. Keys name one component or several collocated ones separated by commas; values are device
ranges counted across all nodes (device ``d`` lives on node ``d // devices_per_node``)::

    {"actor,env,rollout": "all"}                         # everything collocated on every device
    {"actor": "0-3", "rollout": "4-5", "env": "6-7"}     # disjoint ("disaggregated") placement
    {"actor,rollout": "0-5", "env": 6}                   # a single int (or "6") is one device

Rules: the components are exactly ``actor``, ``rollout`` and ``env``; each is placed exactly once; two
components either use exactly the same devices (collocated) or disjoint ones — a partial overlap is an error.
This module is pure data: no Ray, no torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import combinations
from typing import Any

COMPONENTS: tuple[str, ...] = ("actor", "env", "rollout")

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")
_KEY = "cluster.component_placement"


class PlacementError(ValueError):
    """A placement the recipe or the cluster cannot hold; the message is one line saying what to change."""


@dataclass(frozen=True)
class Placement:
    """Devices of every component.

    Attributes:
        devices: component name -> sorted global device ids (``0 .. num_nodes * devices_per_node - 1``).
        num_nodes: nodes of the cluster.
        devices_per_node: accelerators (or CPU "devices") per node.
    """

    devices: dict[str, tuple[int, ...]]
    num_nodes: int = 1
    devices_per_node: int = 1

    @property
    def num_devices(self) -> int:
        """Devices of the whole cluster (``num_nodes * devices_per_node``), used or not."""
        return self.num_nodes * self.devices_per_node

    @property
    def used_devices(self) -> tuple[int, ...]:
        """Sorted ids of the devices that hold at least one component."""
        return tuple(sorted({d for devs in self.devices.values() for d in devs}))

    def devices_of(self, component: str) -> tuple[int, ...]:
        """Device ids of ``component``; a ValueError lists the valid names on a miss."""
        if component not in self.devices:
            raise ValueError(f"unknown component {component!r}; valid components: {', '.join(sorted(self.devices))}")
        return self.devices[component]

    def num_workers(self, component: str) -> int:
        """One worker per device: the data-parallel size of ``component``."""
        return len(self.devices_of(component))

    def is_collocated(self, a: str, b: str) -> bool:
        """True when ``a`` and ``b`` run on exactly the same devices (and so share them in turn)."""
        return self.devices_of(a) == self.devices_of(b)

    def components_on(self, device: int) -> tuple[str, ...]:
        """Components that share ``device`` (sorted); empty for an unused device."""
        return tuple(sorted(c for c, devs in self.devices.items() if device in devs))

    def node_of(self, device: int) -> int:
        """Index of the node that holds global device ``device``."""
        if not 0 <= device < self.num_devices:
            raise ValueError(f"device {device} is outside the cluster of {self._size_text()}")
        return device // self.devices_per_node

    def local_index(self, device: int) -> int:
        """Index of ``device`` on its own node (``0 .. devices_per_node - 1``)."""
        self.node_of(device)
        return device % self.devices_per_node

    def _size_text(self) -> str:
        return _size_text(self.num_nodes, self.devices_per_node)


def parse_placement(component_placement: Mapping[str, Any], num_nodes: int, devices_per_node: int) -> Placement:
    """Parse and validate ``cluster.component_placement``.

    Args:
        component_placement: ``{"comp[,comp...]": "all" | "a-b" | int}`` (a dict or an OmegaConf DictConfig).
        num_nodes: ``cluster.num_nodes`` (>= 1).
        devices_per_node: accelerators per node, already resolved (see ``detect_devices_per_node``).

    Returns:
        The :class:`Placement`.

    Raises:
        PlacementError: (a ValueError) a one-line message naming the bad entry, what was expected and how to fix it.
        TypeError: ``component_placement`` is not a mapping, or a key is not a string.
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise PlacementError(f"cluster.num_nodes must be an integer >= 1, got {num_nodes!r}")
    if isinstance(devices_per_node, bool) or not isinstance(devices_per_node, int) or devices_per_node < 1:
        raise PlacementError(f"devices per node must be an integer >= 1, got {devices_per_node!r}")
    if not isinstance(component_placement, Mapping):
        raise TypeError(
            f"{_KEY} must be a mapping like {{'actor,env,rollout': 'all'}}, got {type(component_placement).__name__}"
        )
    devices: dict[str, tuple[int, ...]] = {}
    source: dict[str, str] = {}
    for key, spec in component_placement.items():
        for name in _split_key(key):
            if name in devices:
                raise PlacementError(
                    f"{_KEY} places {name!r} twice (in {source[name]!r} and {key!r}); give each component one entry"
                )
            devices[name] = _parse_devices(key, spec, num_nodes, devices_per_node)
            source[name] = str(key)
    missing = [c for c in COMPONENTS if c not in devices]
    if missing:
        raise PlacementError(
            f"{_KEY} does not place {', '.join(map(repr, missing))}; every component ({', '.join(COMPONENTS)}) "
            f"needs devices, e.g. {{'actor,env,rollout': 'all'}}"
        )
    _check_overlaps(devices)
    ordered = {c: devices[c] for c in COMPONENTS}
    return Placement(devices=ordered, num_nodes=num_nodes, devices_per_node=devices_per_node)


def format_devices(devices: tuple[int, ...] | list[int]) -> str:
    """Compact text for device ids: ``(0, 1, 2, 5)`` -> ``"0-2,5"``."""
    parts: list[str] = []
    ids = sorted(devices)
    start = prev = None
    for d in ids + [None]:
        if start is not None and (d is None or d != prev + 1):
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if d is not None and start is None:
            start = d
        prev = d
    return ",".join(parts)


def _split_key(key: Any) -> list[str]:
    if not isinstance(key, str):
        raise TypeError(f"{_KEY} key {key!r} must be a component name or names like 'actor,rollout'")
    names = [n.strip() for n in key.split(",")]
    for name in names:
        if name not in COMPONENTS:
            what = "an empty component name" if not name else f"unknown component {name!r}"
            raise PlacementError(f"{_KEY} key {key!r} has {what}; valid components: {', '.join(COMPONENTS)}")
    if len(set(names)) != len(names):
        raise PlacementError(f"{_KEY} key {key!r} names a component twice; list each component once")
    return names


def _parse_devices(key: str, spec: Any, num_nodes: int, devices_per_node: int) -> tuple[int, ...]:
    num_devices = num_nodes * devices_per_node
    where = f"{_KEY}[{key!r}] = {spec!r}"
    if isinstance(spec, str) and spec.strip().lower() == "all":
        return tuple(range(num_devices))
    match = _RANGE.match(spec) if isinstance(spec, str) else None
    if isinstance(spec, int) and not isinstance(spec, bool):
        first, last = spec, spec
    elif match:
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
    else:
        raise PlacementError(
            f"{where} is not a device range; use 'all', a device id like 3, or a range 'a-b' like '0-3'"
        )
    if first < 0:
        raise PlacementError(f"{where}: device ids start at 0")
    if first > last:
        raise PlacementError(f"{where} is reversed; write '{last}-{first}'")
    if last >= num_devices:
        raise PlacementError(
            f"{where} reaches device {last}, but the cluster has {_size_text(num_nodes, devices_per_node)}; "
            f"fix the range or set cluster.num_nodes / cluster.num_devices_per_node"
        )
    return tuple(range(first, last + 1))


def _check_overlaps(devices: dict[str, tuple[int, ...]]) -> None:
    for a, b in combinations(COMPONENTS, 2):
        shared = set(devices[a]) & set(devices[b])
        if shared and devices[a] != devices[b]:
            raise PlacementError(
                f"{_KEY}: {a} (devices {format_devices(devices[a])}) and {b} (devices {format_devices(devices[b])}) "
                f"partially overlap on devices {format_devices(sorted(shared))}; components either share exactly "
                f"the same devices (collocated, e.g. '{a},{b}': '{format_devices(devices[a])}') or disjoint ones"
            )


def _size_text(num_nodes: int, devices_per_node: int) -> str:
    n = num_nodes * devices_per_node
    ids = "device id 0" if n == 1 else f"device ids 0-{n - 1}"
    return f"{n} device{'s' * (n != 1)} (num_nodes={num_nodes} x {devices_per_node} per node; {ids})"
