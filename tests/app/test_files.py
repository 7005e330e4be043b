"""write_text_atomic: a write killed midway leaves the previous file whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.files import write_text_atomic


def test_a_write_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    write_text_atomic(path, "first\n")
    write_text_atomic(path, "second\n")
    assert path.read_text() == "second\n" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_write_that_fails_midway_leaves_the_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "report.json"
    write_text_atomic(path, "previous\n")
    real_write = Path.write_text

    def killed(self: Path, text: str, *args: object, **kwargs: object) -> int:
        real_write(self, text[:3])
        raise OSError("no space left on device")

    monkeypatch.setattr(Path, "write_text", killed)
    with pytest.raises(OSError, match="no space"):
        write_text_atomic(path, "the new report\n")
    assert path.read_text() == "previous\n"
