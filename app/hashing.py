"""The one sha256 of a file, used for model weights, artifacts and training data alike."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK_BYTES = 1 << 22


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks (model weights can be gigabytes)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
