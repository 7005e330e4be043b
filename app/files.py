"""Writing a file whole or not at all, and still there after a crash."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file renamed over it: a write killed midway leaves the previous
    file whole (a truncated manifest, report or run record would be unreadable), never a part of the new one.
    The text is on disk before the rename, and the rename before this returns: after a power loss or a killed
    machine the file is the previous one or the new one, not an empty file under the new name."""
    staging = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with staging.open("w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(staging, path)
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
