"""write_text_atomic: a write killed midway leaves the previous file whole, and what is written reaches the disk
before the name that points at it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.files import sync_tree, write_text_atomic


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
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary file left beside it


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


def test_a_folder_s_files_and_entries_are_synced_all_the_way_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.npy").write_bytes(b"a")
    (tmp_path / "texts.json").write_text("[]")
    (tmp_path / "alternatives" / "authors").mkdir(parents=True)
    (tmp_path / "alternatives" / "authors" / "regressor.joblib").write_bytes(b"r")
    events = record_disk_order(monkeypatch)
    sync_tree(tmp_path)
    synced = [path for _, path in events]
    assert sorted(synced) == sorted(
        str(path)
        for path in (
            tmp_path / "a.npy",
            tmp_path / "texts.json",
            tmp_path / "alternatives" / "authors" / "regressor.joblib",
            tmp_path / "alternatives" / "authors",
            tmp_path / "alternatives",
            tmp_path,
        )
    )
    assert synced[-1] == str(tmp_path)  # a folder after what it holds
    assert synced.index(str(tmp_path / "alternatives")) > synced.index(str(tmp_path / "alternatives" / "authors"))
