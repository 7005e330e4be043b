"""Fixtures of the playground tests: an artifact whose report folder holds PNGs (and traps)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

# The smallest valid PNG (1x1, transparent): what the route serves must come back byte for byte.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


@pytest.fixture(scope="session")
def artifact_with_report(tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny artifact plus a report folder holding PNGs, a non-PNG, and traps outside it."""
    folder = tmp_path_factory.mktemp("report-artifact") / "tiny-tad"
    shutil.copytree(tiny_artifact, folder)
    report = folder / "report"
    (report / "curves").mkdir(parents=True, exist_ok=True)
    (report / "rejection_test.png").write_bytes(PNG)
    (report / "curves" / "nested.png").write_bytes(PNG)
    (report / "report.md").write_text("# not a picture\n")
    (report / "fake.png.txt").write_text("not a picture either\n")
    (folder / "secret.png").write_bytes(PNG)  # a PNG, but outside the report folder
    (report / "escape.png").symlink_to(folder / "secret.png")  # a link leading out of it
    (report / "manifest-link.png").symlink_to(folder / "manifest.json")
    return folder
