"""The dequantised copy of a GGUF model in the cache: keyed, shared, made again when it does not load."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from app.engine import model_cache
from app.engine.loading import ModelSource, _load_cached_copy
from app.engine.model_cache import COMPLETE_MARKER, UNVERIFIED, cache_key, dequantised_copy
from app.files import STALE_AFTER_S, remove_stale

SHA = "ab" * 32


@pytest.fixture
def dequantisations(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Parsing a GGUF, stood in for by the tiny model's folder: each call is recorded."""
    calls: list[str] = []

    class GGUFTokenizer:
        @staticmethod
        def from_pretrained(location: str, gguf_file: str) -> object:
            calls.append(gguf_file)
            return AutoTokenizer.from_pretrained(tiny_model_dir)

    class GGUFModel:
        @staticmethod
        def from_pretrained(location: str, gguf_file: str, dtype: torch.dtype) -> object:
            return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype)

    monkeypatch.setattr(model_cache, "AutoTokenizer", GGUFTokenizer)
    monkeypatch.setattr(model_cache, "AutoModelForCausalLM", GGUFModel)
    return calls


def test_unverified_models_each_get_their_own_copy(tmp_path: Path) -> None:
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    first.write_bytes(b"one")
    second.write_bytes(b"two")
    assert cache_key(first, SHA) == SHA[:32]
    unverified = cache_key(first, UNVERIFIED)
    assert unverified.startswith("unverified-") and unverified != cache_key(second, UNVERIFIED)
    assert cache_key(first, UNVERIFIED) == unverified  # the same file: the same copy


def test_a_copy_is_made_once_readable_by_all_and_made_again_for_another_key(
    tmp_path: Path, dequantisations: list[str]
) -> None:
    cache = tmp_path / "cache"
    folder = dequantised_copy("src", "m.gguf", SHA, cache, torch.float32)
    assert folder.name == f"gguf-{SHA[:32]}" and (folder / "model.safetensors").is_file()
    assert (folder / COMPLETE_MARKER).read_text() == SHA  # as copies made before this version hold it
    for path in [folder, *folder.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o044 == 0o044, (path, oct(mode))  # group and others can read
    assert dequantised_copy("src", "m.gguf", SHA, cache, torch.float32) == folder
    assert len(dequantisations) == 1  # reused
    (folder / COMPLETE_MARKER).write_text("another key")  # a marker that is not this copy's
    dequantised_copy("src", "m.gguf", SHA, cache, torch.float32)
    assert len(dequantisations) == 2 and (folder / COMPLETE_MARKER).read_text() == SHA
    assert not [p for p in cache.iterdir() if p.name.startswith(".staging-")]


def test_a_complete_copy_that_does_not_load_is_made_again(tmp_path: Path, dequantisations: list[str]) -> None:
    cache = tmp_path / "cache"
    source = ModelSource(kind="gguf", location=str(tmp_path), gguf_file="m.gguf")
    folder = dequantised_copy(source.location, "m.gguf", SHA, cache, torch.float32)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # torn on disk, its marker still there
    _, model = _load_cached_copy(source, SHA, cache, torch.float32, "eager", {})
    assert len(dequantisations) == 2 and model.config.num_hidden_layers > 0
    assert weights.stat().st_size > 100


def test_leftovers_of_killed_writes_are_removed_when_old(tmp_path: Path) -> None:
    old, fresh = tmp_path / ".staging-old", tmp_path / ".staging-fresh"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"x")
    fresh.mkdir()
    kept = tmp_path / "gguf-complete"
    kept.mkdir()
    hour_ago = time.time() - 2 * STALE_AFTER_S
    os.utime(old, (hour_ago, hour_ago))
    os.utime(kept, (hour_ago, hour_ago))
    remove_stale(tmp_path, ".staging-")
    assert not old.exists() and fresh.exists() and kept.exists()


def test_a_load_error_that_is_not_the_copys_fault_keeps_the_copy(
    tmp_path: Path, dequantisations: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine import loading

    cache = tmp_path / "cache"
    source = ModelSource(kind="gguf", location=str(tmp_path), gguf_file="m.gguf")
    dequantised_copy(source.location, "m.gguf", SHA, cache, torch.float32)

    class PlacementRefused:
        @staticmethod
        def from_pretrained(*args: object, **kwargs: object) -> None:
            raise ValueError("device_map 'auto' needs accelerate")  # a setting's fault, not the file's

    monkeypatch.setattr(loading, "AutoModelForCausalLM", PlacementRefused)
    with pytest.raises(ValueError, match="device_map"):
        _load_cached_copy(source, SHA, cache, torch.float32, "eager", {})
    assert len(dequantisations) == 1  # the good copy was not made again
