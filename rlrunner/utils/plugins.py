"""Plugins: the Python entry points other packages declare for rlrunner (model families, rewards).

A package adds to group ``rlrunner.model_families`` or ``rlrunner.rewards`` in its pyproject.toml
(docs/families/index.md "A family or a reward from your own package"); :func:`load_entry_points` imports each
entry point of a group once. One that fails is reported in one line on stderr (group, name, value and the
exception's first line), never with a traceback, and the others load as usual.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Any


def failure_line(group: str, entry_point: EntryPoint, err: BaseException) -> str:
    """``rlrunner: plugin entry point <group> '<name> = <value>' failed to load: <Type>: <first line>``."""
    text = str(err).splitlines()[0] if str(err) else ""
    return (f"rlrunner: plugin entry point {group} '{entry_point.name} = {entry_point.value}' failed to load: "
            f"{type(err).__name__}{': ' + text if text else ''}")


def load_entry_points(group: str, accept: Callable[[str, Any], None]) -> tuple[dict[str, Any], dict[str, str]]:
    """``(loaded, failed)``: each entry point of ``group`` loaded and handed to ``accept(name, obj)``, which raises
    to refuse it (wrong kind of object, a name already taken); ``loaded`` maps names to the objects accepted,
    ``failed`` to the one line printed on stderr for each entry point that failed to import or was refused."""
    loaded: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for entry_point in entry_points(group=group):
        try:
            obj = entry_point.load()
            accept(entry_point.name, obj)
        except Exception as err:  # noqa: BLE001  a plugin may fail in any way; the in-tree code must still start
            failed[entry_point.name] = failure_line(group, entry_point, err)
            print(failed[entry_point.name], file=sys.stderr)
            continue
        loaded[entry_point.name] = obj
    return loaded, failed
