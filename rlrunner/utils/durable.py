"""Files that survive a power loss: every byte and every directory entry flushed to the disk before a marker says
the write is complete (``rename`` and ``write`` alone only reach the page cache).

Some filesystems refuse to fsync a directory (CIFS/SMB and several FUSE object-store mounts answer EINVAL or
ENOTSUP): there the directory's fsync is skipped with one warning per process, since its entries cannot be made
durable by us, and the write goes on. A file's fsync that fails always raises."""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

logger = logging.getLogger(__name__)

# what a filesystem answers when it cannot fsync a directory (EBADF, EISDIR: platforms that refuse it outright)
DIRECTORY_FSYNC_REFUSED = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EISDIR})
_warned_refusal = False  # one warning per process: a refusing mount refuses every save's folders


def sync_path(path: Path) -> None:
    """``fsync`` one file or folder (a folder's fsync makes its entries, i.e. creations and renames, durable).

    Raises:
        OSError: a file's fsync failed, or a folder's for another reason than :data:`DIRECTORY_FSYNC_REFUSED`.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in DIRECTORY_FSYNC_REFUSED or not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise
        _warn_refused(path, err)
    finally:
        os.close(fd)


def _warn_refused(folder: Path, err: OSError) -> None:
    global _warned_refusal
    if not _warned_refusal:
        _warned_refusal = True
        logger.warning("the filesystem of %s refuses to fsync a folder (%s): writes there go on, but their "
                       "durability across a power loss is not guaranteed there", folder, os.strerror(err.errno))


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
