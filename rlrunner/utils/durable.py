"""Files that survive a power loss: every byte and every directory entry flushed to the disk before a marker says
the write is complete (``rename`` and ``write`` alone only reach the page cache)."""

from __future__ import annotations

import os
from pathlib import Path


def sync_path(path: Path) -> None:
    """``fsync`` one file or folder (a folder's fsync makes its entries, i.e. creations and renames, durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(top: Path) -> None:
    """``fsync`` every file and folder under ``top``, ``top`` itself last: files before the folder naming them."""
    for folder, _, files in os.walk(top, topdown=False):
        for name in files:
            sync_path(Path(folder) / name)
        sync_path(Path(folder))


def write_synced(path: Path, text: str) -> None:
    """Write ``path`` and flush it to the disk."""
    with open(path, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
