"""Handles between worker groups on Ray: object references that a worker host turns back into values."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def resolve_refs(value: Any) -> Any:
    """``value`` with every Ray object reference in it (also inside lists, tuples and dicts) replaced by the
    object, all fetched with one ``ray.get``."""
    import ray

    refs: list[Any] = []

    def walk(item: Any, fetched: Iterator[Any] | None) -> Any:
        """First pass (``fetched`` None): collect the references; second: put the objects in their places."""
        if isinstance(item, ray.ObjectRef) and fetched is None:
            refs.append(item)
        elif isinstance(item, ray.ObjectRef):
            return next(fetched)
        if type(item) in (list, tuple):
            return type(item)(walk(x, fetched) for x in item)
        if type(item) is dict:
            return {k: walk(x, fetched) for k, x in item.items()}
        return item

    walk(value, None)
    return walk(value, iter(ray.get(refs))) if refs else value
