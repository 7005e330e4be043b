"""The store a stopped command's finished work waits in for its rerun."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from training.progress import ProgressStore, digest


def test_an_item_reads_back_as_it_was_saved(tmp_path: Path) -> None:
    store = ProgressStore(tmp_path / "progress" / "key")
    assert store.load("fold-0") is None
    store.save("fold-0", {"prr": [0.25, float("nan")], "n": 3})
    loaded = store.load("fold-0")
    assert loaded is not None
    assert loaded["n"] == 3 and loaded["prr"][0] == 0.25 and loaded["prr"][1] != loaded["prr"][1]


def test_taking_back_an_earlier_runs_work_is_said_once_naming_the_folder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "fit-progress" / "key"
    ProgressStore(folder).save("trial-0", 1)
    ProgressStore(folder).save("trial-1", 2)
    rerun = ProgressStore(folder)
    with caplog.at_level(logging.WARNING, logger="training.progress"):
        assert rerun.load("trial-2") is None  # nothing taken back yet: nothing said
        assert caplog.messages == []
        assert rerun.load("trial-0") == 1 and rerun.load("trial-1") == 2
    assert caplog.messages == [f"resuming: work a stopped run of this command finished is read back from {folder}"]


def test_an_item_cut_short_runs_again(tmp_path: Path) -> None:
    store = ProgressStore(tmp_path / "key")
    store.save("a", [1, 2, 3])
    (tmp_path / "key" / "a.json").write_text("[1, 2")
    assert store.load("a") is None


def test_discard_keeps_another_commands_items(tmp_path: Path) -> None:
    root = tmp_path / "progress"
    mine, other = ProgressStore(root / "mine"), ProgressStore(root / "other")
    mine.save("a", 1)
    other.save("a", 2)
    mine.discard()
    assert not (root / "mine").exists() and other.load("a") == 2
    other.discard()
    assert not root.exists()  # the last one out removes the shared folder


def test_the_key_changes_with_anything_the_work_depends_on() -> None:
    key = digest({"alpha": 1.0}, ["text-1\t0.5", "text-2\t1.0"])
    assert key == digest({"alpha": 1.0}, ["text-1\t0.5", "text-2\t1.0"])
    assert key != digest({"alpha": 0.5}, ["text-1\t0.5", "text-2\t1.0"])
    assert key != digest({"alpha": 1.0}, ["text-1\t0.5", "text-2\t0.0"])
    assert key != digest({"alpha": 1.0}, ["text-1\t0.5"])


def test_removing_the_last_item_removes_the_store_and_its_empty_parent(tmp_path: Path) -> None:
    root = tmp_path / "lodo-progress"
    store = ProgressStore(root / "key")
    store.save("squad", 1)
    store.save("mmlu", 2)
    store.remove("squad")
    assert store.load("squad") is None and store.load("mmlu") == 2
    store.remove("mmlu")
    assert not root.exists()


def test_a_store_that_cannot_be_written_is_said_and_the_work_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Progress only saves a rerun time: a read-only run or a full disk must not stop the command itself."""
    (tmp_path / "a-file").write_text("")
    store = ProgressStore(tmp_path / "a-file" / "key")  # its folder cannot be made
    store.save("fold-0", [1.0])
    assert store.load("fold-0") is None and "progress not kept" in caplog.text
