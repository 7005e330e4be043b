"""Settings read from the environment: the artifact follows the model unless set, and empty means none."""

from __future__ import annotations

import pytest

from app.settings import DEFAULT_ARTIFACT, DEFAULT_MODEL, MODEL_ARTIFACTS, Settings


@pytest.fixture(autouse=True)
def _no_tad_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TAD_MODEL", "TAD_ARTIFACT_DIR", "TAD_DTYPE", "TAD_COMPILED_DECODE_LENGTH", "TAD_CUDA_GRAPHS_LENGTH"):
        monkeypatch.delenv(name, raising=False)


def test_the_default_model_serves_its_committed_artifact() -> None:
    settings = Settings()
    assert settings.model == DEFAULT_MODEL and settings.artifact_dir == DEFAULT_ARTIFACT
    assert (DEFAULT_ARTIFACT / "manifest.json").is_file()


@pytest.mark.parametrize("name", sorted(MODEL_ARTIFACTS))
def test_a_catalog_name_alone_switches_model_and_artifact(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAD_MODEL", name.upper())  # catalog names are case-insensitive
    settings = Settings()
    assert settings.artifact_dir == MODEL_ARTIFACTS[name] and (settings.artifact_dir / "manifest.json").is_file()


def test_another_model_has_no_artifact_unless_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAD_MODEL", "/models/own.gguf")
    assert Settings().artifact_dir is None
    monkeypatch.setenv("TAD_ARTIFACT_DIR", "/artifacts/own")
    assert str(Settings().artifact_dir) == "/artifacts/own"


def test_an_empty_artifact_dir_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAD_ARTIFACT_DIR", "")
    assert Settings().artifact_dir is None
    monkeypatch.setenv("TAD_ARTIFACT_DIR", "  ")
    assert Settings().artifact_dir is None


def test_a_log_level_neither_logging_nor_uvicorn_knows_is_refused_by_name() -> None:
    from pydantic import ValidationError

    assert Settings(log_level="DEBUG").log_level == "debug"
    with pytest.raises(ValidationError, match=r"log_level\n.*must be one of critical, error, warning, info, debug"):
        Settings(log_level="loud")


def test_the_compiled_decode_length_is_read_under_its_name_and_its_former_cuda_only_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMPILED_DECODE_LENGTH", "64")  # no `TAD_` prefix: not this service's setting
    assert Settings().compiled_decode_length == 0
    assert Settings(compiled_decode_length=512).compiled_decode_length == 512
    monkeypatch.setenv("TAD_CUDA_GRAPHS_LENGTH", "288")
    assert Settings().compiled_decode_length == 288
    monkeypatch.setenv("TAD_COMPILED_DECODE_LENGTH", "1024")
    assert Settings().compiled_decode_length == 1024  # the current name wins
