"""Writing a file whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file renamed over it: a write killed midway leaves the previous
    file whole (a truncated manifest, report or run record would be unreadable), never a part of the new one."""
    staging = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    staging.write_text(text)
    os.replace(staging, path)
