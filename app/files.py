"""Writing a file whole or not at all, and still there after a crash; removing what a killed write left."""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

logger = logging.getLogger(__name__)


def write_text_atomic(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file renamed over it: a write killed midway leaves the previous
    file whole (a truncated manifest, report or run record would be unreadable), never a part of the new one.
    The text is on disk before the rename, and the rename before this returns: after a power loss or a killed
    machine the file is the previous one or the new one, not an empty file under the new name."""
    staging = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with staging.open("w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(staging, path)
    except BaseException:  # Ctrl-C or a full disk: no stray temporary file beside the one kept whole
        staging.unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def sync_tree(folder: Path) -> None:
    """Flush every file under `folder`, and every folder's entries, to disk (before the folder is renamed into
    place: the rename must not reach the disk before what it names)."""
    for item in folder.iterdir():
        if item.is_dir() and not item.is_symlink():
            sync_tree(item)
        elif item.is_file():
            descriptor = os.open(item, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
    sync_folder(folder)


def sync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename or a new file in it) to disk."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# A staging folder or joining file older than this is a killed start's (a write takes a minute at most).
STALE_AFTER_S = 3600.0


def remove_stale(folder: Path, prefix: str, older_than_s: float = STALE_AFTER_S) -> None:
    """Leftovers of writes that were killed (SIGKILL, the OOM killer, a stop during the first start), which no
    `finally` removed: gigabytes each, in a volume that only grows."""
    cutoff = time.time() - older_than_s
    for item in folder.glob(f"{prefix}*") if folder.is_dir() else ():
        try:
            if item.stat().st_mtime < cutoff:
                logger.info("removing %s, left by a write that did not finish", item)
                shutil.rmtree(item) if item.is_dir() else item.unlink()
        except OSError:  # another process removed it, or cannot be removed: not this start's business
            continue
