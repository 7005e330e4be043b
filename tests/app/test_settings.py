"""Settings read from the environment: the artifact follows the model unless set, and empty means none."""

from __future__ import annotations

import pytest

from app.settings import DEFAULT_ARTIFACT, DEFAULT_MODEL, MODEL_ARTIFACTS, Settings, unknown_variables


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


def test_the_compiled_decode_length_is_read_under_its_name_and_its_former_name_is_refused_naming_the_new(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COMPILED_DECODE_LENGTH", "256")  # no `TAD_` prefix: not this service's setting
    assert Settings().compiled_decode_length == 0
    assert Settings(compiled_decode_length=512).compiled_decode_length == 512
    monkeypatch.setenv("TAD_COMPILED_DECODE_LENGTH", "1024")
    assert Settings().compiled_decode_length == 1024
    assert unknown_variables({"TAD_CUDA_GRAPHS_LENGTH": "288"}) == [
        "TAD_CUDA_GRAPHS_LENGTH: renamed TAD_COMPILED_DECODE_LENGTH"
    ]


def test_a_variable_that_sets_nothing_is_named_with_the_setting_meant() -> None:
    environment = {
        "TAD_MAX_BATCH": "4",  # misspelt
        "TAD_NOTHING_LIKE_IT": "1",
        "TAD_PORT": "9000",  # a setting
        "TAD_PHASE_TIMING": "1",  # read by the phase clock
        "TAD_REPLICA_1": "tad1:8000",  # the balancer's
        "TAD_BALANCER_BIND": ":8080",
        "PATH": "/usr/bin",
    }
    assert unknown_variables(environment) == [
        "TAD_MAX_BATCH: no such setting (did you mean TAD_MAX_BATCH_SIZE?)",
        "TAD_NOTHING_LIKE_IT: no such setting",
    ]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"fallback_method": "tad"}, "tad needs a TAD regressor"),
        ({"api_key": ""}, "empty: unset it"),
        ({"host": ""}, "at least 1 character"),
        ({"model": ""}, "at least 1 character"),
        ({"cache_dir": " "}, "empty: unset it"),
        ({"withheld_message": "  "}, "blank"),
        ({"device": "gpu"}, "not a device name"),
        ({"dtype": "fp16"}, "'auto', 'float32', 'bfloat16' or 'float16'"),
        ({"artifact_manifest_sha256": "xyz"}, "should match pattern"),
        ({"batch_window_ms": float("inf")}, "less than or equal to 60000"),
        ({"request_timeout_s": float("inf")}, "less than or equal to 86400"),
        ({"compiled_decode_length": 1}, "0 or at least 128"),
        ({"default_max_new_tokens": 1000}, "TAD_DEFAULT_MAX_NEW_TOKENS (1000) is above TAD_MAX_NEW_TOKENS_LIMIT (512)"),
        ({"reject_threshold": 0.5}, "TAD_REJECT_THRESHOLD needs TAD_REJECT_METHOD"),
        (
            {"artifact_dir": "", "artifact_manifest_sha256": "a" * 64},
            "pins an artifact, but TAD_ARTIFACT_DIR names none",
        ),
        ({"verify_model_sha256": False}, "set TAD_ARTIFACT_DIR= (no artifact) as well"),
    ],
)
def test_a_setting_that_would_fail_later_or_mislead_is_refused_at_start(
    values: dict[str, object], message: str
) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as refused:
        Settings(**values)  # type: ignore[arg-type]
    assert message in str(refused.value)


def test_what_the_checks_refuse_has_a_valid_form() -> None:
    settings = Settings(
        fallback_method="msp",  # type: ignore[arg-type]
        device="cuda:1",
        reject_method="tad",  # type: ignore[arg-type]
        reject_threshold=0.5,
        artifact_manifest_sha256="A" * 64,
        compiled_decode_length=128,
        default_max_new_tokens=512,
    )
    assert settings.artifact_manifest_sha256 == "a" * 64  # as hashlib writes it, so that it compares equal
    assert Settings(verify_model_sha256=False, artifact_dir="").artifact_dir is None  # type: ignore[arg-type]
    assert Settings(reject_target="").reject_target is None  # no target, as `TAD_REJECT_TARGET=` says it
    assert Settings(artifact_manifest_sha256="").artifact_manifest_sha256 is None  # no pin


def test_lowering_the_answer_limit_alone_lowers_the_default_with_it() -> None:
    assert Settings(max_new_tokens_limit=32).default_max_new_tokens == 32
    assert Settings(max_new_tokens_limit=1000).default_max_new_tokens == 64


def test_the_shortest_compiled_length_allowed_is_the_shortest_slot_read() -> None:
    from app.engine.slot_decoding import SMALLEST_WIDTH
    from app.settings import MIN_COMPILED_DECODE_LENGTH

    assert MIN_COMPILED_DECODE_LENGTH == SMALLEST_WIDTH


def test_variables_that_links_put_in_a_containers_environment_are_passed_over() -> None:
    """Kubernetes' service links and Docker's legacy links, for a service or container named tad-serve."""
    links = {"TAD_SERVE_SERVICE_HOST": "", "TAD_SERVE_PORT": "", "TAD_SERVE_PORT_80_TCP_PROTO": ""}
    assert unknown_variables(links) == []
    assert unknown_variables({"tad_max_batch": "4"}) == [  # pydantic-settings reads names in any case
        "tad_max_batch: no such setting (did you mean TAD_MAX_BATCH_SIZE?)"
    ]
