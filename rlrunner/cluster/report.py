"""The placement report: ``<log_dir>/placement.json`` and the table printed at start ("where did my workers go")."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from rlrunner.cluster.base import WorkerGroup

REPORT_NAME = "placement.json"
_COLUMNS = ("component", "rank", "node_ip", "node_id", "device")
_SHORT_ID = 8  # hex digits of a Ray node id the table shows (the JSON keeps the whole id)


def write_placement_report(groups: Sequence[WorkerGroup], log_dir: Path) -> list[dict]:
    """Write ``log_dir/placement.json`` and print the same entries as a table on stderr.

    Args:
        groups: the spawned worker groups (e.g. actor, rollout, env).
        log_dir: the run's directory.

    Returns:
        One entry per worker, in group then rank order: ``{"component", "rank", "node_id", "node_ip",
        "device"}`` (see :class:`~rlrunner.cluster.base.WorkerLocation`).
    """
    entries = [asdict(location) for group in groups for location in group.locations()]
    path = Path(log_dir) / REPORT_NAME
    path.write_text(json.dumps(entries, indent=2) + "\n")
    print(f"placement ({path}):\n{format_placement_table(entries)}", file=sys.stderr, flush=True)
    return entries


def format_placement_table(entries: Sequence[dict]) -> str:
    """The entries as aligned text columns, node ids shortened."""
    rows = [_COLUMNS] + [tuple(str(e[c])[:_SHORT_ID] if c == "node_id" else str(e[c]) for c in _COLUMNS)
                         for e in entries]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
