"""Work a long command finished before it was stopped, kept so that the same command, rerun, takes it back.

A store is a folder named by a digest of everything its items depend on (`digest`): a command that differs in
anything finds another folder, so one command's items are never taken for another's. Each item is one JSON
file, written whole (a stop mid-write leaves the item missing, never cut short). The command discards its
store once its outputs are written; nothing is left to resume then.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from app.files import write_text_atomic

logger = logging.getLogger(__name__)

# How a folder of stores is named (fit's `fit-progress`, lodo's `lodo-progress`): kept when an artifact is refitted.
PROGRESS_SUFFIX = "-progress"


def digest(described: Any, lines: Iterable[str] = ()) -> str:
    """A short key for a description (JSON-able) and per-item lines (e.g. one per text the work reads)."""
    hashed = hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode())
    for line in lines:
        hashed.update(f"{line}\n".encode())
    return hashed.hexdigest()[:24]


def array_digest(values: np.ndarray) -> str:
    """A short key for an array's numbers (a text's probabilities, statistics or attention rows in a key line)."""
    return hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()[:16]


class ProgressStore:
    """The finished items of one command, as JSON files in `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._resumed = False

    def load(self, name: str) -> Any | None:
        """The item if an earlier run of this command finished it; None otherwise (or if it cannot be read)."""
        path = self.folder / f"{name}.json"
        if not path.exists():
            return None
        try:
            item = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            logger.warning("progress %s unreadable (%s): its work runs again", path, error)
            return None
        if not self._resumed:  # once: the user should know results come back from an earlier run, and from where
            self._resumed = True
            logger.warning("resuming: work a stopped run of this command finished is read back from %s", self.folder)
        return item

    def save(self, name: str, value: Any) -> None:
        """Best effort: progress only saves a rerun time, so a folder that cannot be written (a read-only run,
        a full disk) is said and the command goes on."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.folder / f"{name}.json", json.dumps(value))
        except OSError as error:
            logger.warning("progress not kept in %s (%s): a rerun would redo this work", self.folder, error)

    def remove(self, name: str) -> None:
        """Remove one item, and the store's folders once they are empty."""
        (self.folder / f"{name}.json").unlink(missing_ok=True)
        for folder in (self.folder, self.folder.parent):
            with contextlib.suppress(OSError):  # not empty: other items, or another command's store
                folder.rmdir()

    def discard(self) -> None:
        """Remove this command's items, and their parent folder once no other command's are left in it."""
        shutil.rmtree(self.folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.folder.parent.rmdir()
