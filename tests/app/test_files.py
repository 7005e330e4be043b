"""write_text_atomic: a write killed midway leaves the previous file whole, and what is written reaches the disk
before the name that points at it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.files import sync_files, write_text_atomic


def test_a_write_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    write_text_atomic(path, "first\n")
    write_text_atomic(path, "second\n")
    assert path.read_text() == "second\n" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_write_that_fails_midway_leaves_the_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "report.json"
    write_text_atomic(path, "previous\n")

    def disk_full(descriptor: int) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="no space"):
        write_text_atomic(path, "the new report\n")
    assert path.read_text() == "previous\n"


def record_disk_order(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """("sync", path) and ("rename", target) in the order they happen."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor: int) -> None:
        events.append(("sync", os.readlink(f"/proc/self/fd/{descriptor}")))
        real_fsync(descriptor)

    def replace(source: str | Path, target: str | Path) -> None:
        events.append(("rename", str(target)))
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def test_the_text_is_on_disk_before_the_rename_and_the_rename_before_the_return(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Otherwise a power loss can leave an empty file under the new name (ext4 and others reorder them)."""
    path = tmp_path / "manifest.json"
    events = record_disk_order(monkeypatch)
    write_text_atomic(path, "{}")
    staging = events[0][1]
    assert staging.endswith(".tmp") and Path(staging).parent == tmp_path
    assert events == [("sync", staging), ("rename", str(path)), ("sync", str(tmp_path))]


def test_a_folder_s_files_and_entries_are_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.npy").write_bytes(b"a")
    (tmp_path / "texts.json").write_text("[]")
    (tmp_path / "sub").mkdir()
    events = record_disk_order(monkeypatch)
    sync_files(tmp_path)
    assert sorted(events[:-1]) == [("sync", str(tmp_path / "a.npy")), ("sync", str(tmp_path / "texts.json"))]
    assert events[-1] == ("sync", str(tmp_path))
