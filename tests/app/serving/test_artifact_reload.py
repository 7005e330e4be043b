"""Artifact hot reload: checked before the swap, in-flight requests keep their artifact, refusals keep the old one."""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.engine.loading import LoadedModel
from app.engine.prompt_attention import prompt_statistic_names
from app.settings import Settings
from app.uncertainty.artifact import read_manifest
from tests.app.service_client import long_chat, make_client

RELOAD = "/admin/reload-artifact"


@pytest.fixture(scope="module")
def other_artifact(tmp_path_factory: pytest.TempPathFactory, tiny_runs: dict[str, Path], tiny_artifact: Path) -> Path:
    """A second artifact for the same model: another regressor (same lags and convention)."""
    from training.commands.fit import FitOptions, run_fit

    convention = read_manifest(tiny_artifact).features.convention
    out = tmp_path_factory.mktemp("other") / "other-tad"
    run_fit(
        FitOptions(
            runs=[tiny_runs["train"]], out=out, alphas=(1000.0,), conventions=(convention,), extra_feature_sets=()
        )
    )
    return out


@pytest.fixture
def served(tmp_path: Path, tiny_artifact: Path) -> Path:
    """The folder TAD_ARTIFACT_DIR points at, a copy that tests replace."""
    folder = tmp_path / "serving"
    shutil.copytree(tiny_artifact, folder)
    return folder


@pytest.fixture
def client(service_settings: Settings, served: Path) -> Iterator[TestClient]:
    with make_client(service_settings, artifact_dir=served) as client:
        yield client


def _replace(folder: Path, source: Path) -> None:
    shutil.rmtree(folder)
    shutil.copytree(source, folder)


def _confidences(client: TestClient, payload: dict) -> list[float]:
    return [token["confidence"] for token in client.post("/v1/generate", json=payload).json()["tokens"]]


def test_reload_swaps_the_artifact_and_reports_it(client: TestClient, served: Path, other_artifact: Path) -> None:
    before = client.get("/info").json()["artifact"]["manifest_sha256"]
    _replace(served, other_artifact)
    response = client.post(RELOAD)
    assert response.status_code == 200, response.text
    after = response.json()["manifest_sha256"]
    assert after != before and client.get("/info").json()["artifact"]["manifest_sha256"] == after
    metrics = client.get("/metrics").text
    assert f'manifest_sha256="{after}"' in metrics and f'manifest_sha256="{before}"' not in metrics
    assert 'tad_artifact_reloads_total{outcome="loaded"} 1.0' in metrics


def test_a_tampered_artifact_is_refused_and_the_old_one_keeps_serving(
    client: TestClient, served: Path, other_artifact: Path
) -> None:
    payload = {"messages": long_chat(client, 8), "max_new_tokens": 8}
    serving_before = _confidences(client, payload)
    before = client.get("/info").json()["artifact"]["manifest_sha256"]
    _replace(served, other_artifact)
    (served / "regressor.joblib").write_bytes(b"not the regressor the manifest vouches for")
    response = client.post(RELOAD)
    assert response.status_code == 409 and response.json()["error"]["type"] == "conflict"
    assert "previous one keeps serving" in response.json()["error"]["message"]
    assert client.get("/info").json()["artifact"]["manifest_sha256"] == before
    assert _confidences(client, payload) == serving_before
    assert 'tad_artifact_reloads_total{outcome="refused"} 1.0' in client.get("/metrics").text


def test_an_artifact_that_fails_to_unpickle_is_a_409_not_a_500(
    client: TestClient, served: Path, other_artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hashes match, but unpickling breaks (e.g. a regressor saved by another scikit-learn)."""
    import app.serving.runtime as runtime_module

    def broken(*args: object, **kwargs: object) -> None:
        raise ModuleNotFoundError("No module named 'sklearn.linear_model._gone'")

    before = client.get("/info").json()["artifact"]["manifest_sha256"]
    _replace(served, other_artifact)
    monkeypatch.setattr(runtime_module, "load_artifact", broken)
    response = client.post(RELOAD)
    assert response.status_code == 409 and "ModuleNotFoundError" in response.json()["error"]["message"]
    assert client.get("/info").json()["artifact"]["manifest_sha256"] == before
    assert 'tad_artifact_reloads_total{outcome="refused"} 1.0' in client.get("/metrics").text


def test_an_artifact_the_running_engine_cannot_feed_is_refused(client: TestClient, served: Path) -> None:
    manifest = json.loads((served / "manifest.json").read_text())
    manifest["features"]["n_lags"] += 1
    (served / "manifest.json").write_text(json.dumps(manifest))
    response = client.post(RELOAD)
    assert response.status_code == 409
    # Feature sizes no longer match the regressor, or the lag count differs from the engine's: either way refused.
    assert "artifact" in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def studied_artifact(tmp_path_factory: pytest.TempPathFactory, tiny_runs: dict[str, Path], tiny_artifact: Path) -> Path:
    """An artifact of the same model fitted with statistics only an annotated copy of the runs holds."""
    from tests.artifacts import studied_artifact

    statistics = ("study_a", "study_b", "study_c", "study_d")
    return studied_artifact(tiny_runs["train"], tmp_path_factory.mktemp("studied"), statistics, tiny_artifact)


STUDIED = r"scores with 4 per-token statistics the server does not compute \(study_a, study_b, study_c and 1 more\)"


def test_an_artifact_reading_statistics_the_server_does_not_compute_is_refused_at_start(
    service_settings: Settings, studied_artifact: Path
) -> None:
    from app.serving.runtime import Runtime, StartupError
    from app.telemetry import ServiceMetrics

    settings = service_settings.model_copy(update={"artifact_dir": studied_artifact})
    with pytest.raises(StartupError, match=STUDIED):
        Runtime(settings, ServiceMetrics()).load()


def test_an_artifact_reading_statistics_the_server_does_not_compute_is_refused_on_reload(
    client: TestClient, served: Path, studied_artifact: Path
) -> None:
    payload = {"messages": [{"role": "user", "content": "Hi"}], "max_new_tokens": 4, "temperature": 0}
    before = _confidences(client, payload)
    _replace(served, studied_artifact)
    response = client.post(RELOAD)
    assert response.status_code == 409
    assert re.search(STUDIED, response.json()["error"]["message"])
    assert _confidences(client, payload) == before


@pytest.fixture(scope="module")
def prompt_artifact(
    tmp_path_factory: pytest.TempPathFactory, tiny_runs: dict[str, Path], tiny_artifact: Path, tiny_loaded: LoadedModel
) -> Path:
    """An artifact fitted with every head's attention to the prompt (which the engine computes when asked)."""
    from tests.artifacts import studied_artifact

    names = prompt_statistic_names(tiny_loaded.identity.num_layers, tiny_loaded.identity.num_heads)
    return studied_artifact(tiny_runs["train"], tmp_path_factory.mktemp("prompt"), names, tiny_artifact)


def test_an_artifact_reading_the_attention_to_the_prompt_makes_the_engine_compute_it(
    service_settings: Settings, prompt_artifact: Path
) -> None:
    with make_client(service_settings, artifact_dir=prompt_artifact) as client:
        assert client.app.state.runtime.engine.prompt_statistics  # type: ignore[attr-defined]
        payload = {"messages": long_chat(client, 8), "max_new_tokens": 8, "temperature": 0}
        generated = client.post("/v1/generate", json=payload).json()
        assert generated["decision"]["method"] == "tad" and len(generated["tokens"]) == 8
        response = {"messages": payload["messages"], "response": generated["text"]}
        scored = client.post("/v1/score", json=response).json()
        streamed = []
        with client.stream("POST", "/v1/generate", json={**payload, "stream": True}) as stream:
            for line in stream.iter_lines():
                data = json.loads(line.removeprefix("data: ")) if line.startswith("data: ") else {}
                if "confidence" in data and "index" in data:
                    streamed.append(data["confidence"])
    # Generation, its stream and teacher-forced scoring feed the regressor the same statistics.
    assert streamed == pytest.approx([t["confidence"] for t in generated["tokens"]], abs=1e-12)
    assert [t["id"] for t in scored["tokens"]] == [t["id"] for t in generated["tokens"]]
    confidences = [t["confidence"] for t in generated["tokens"]]
    assert [t["confidence"] for t in scored["tokens"]] == pytest.approx(confidences, abs=1e-5)
    assert scored["decision"]["score"] == pytest.approx(generated["decision"]["score"], abs=1e-5)


def test_an_engine_started_without_them_refuses_to_reload_an_artifact_that_reads_them(
    client: TestClient, served: Path, prompt_artifact: Path
) -> None:
    assert not client.app.state.runtime.engine.prompt_statistics  # type: ignore[attr-defined]
    _replace(served, prompt_artifact)
    response = client.post(RELOAD)
    assert response.status_code == 409
    assert "restart the service to compute it" in response.json()["error"]["message"]


def test_a_request_in_flight_finishes_with_the_artifact_it_started_with(
    client: TestClient, served: Path, other_artifact: Path, caplog: pytest.LogCaptureFixture
) -> None:
    payload = {"messages": long_chat(client, 24), "max_new_tokens": 24}
    old = _confidences(client, payload)
    runtime = client.app.state.runtime  # type: ignore[attr-defined]
    old_sha = runtime.serving.manifest_sha256
    caplog.set_level(logging.INFO, logger="tad.decisions")
    caplog.clear()
    streamed: list[float] = []
    with client.stream("POST", "/v1/generate", json={**payload, "stream": True}) as response:
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = json.loads(line.removeprefix("data: "))
            if "confidence" in data and "index" in data:
                streamed.append(data["confidence"])
                if len(streamed) == 2:  # mid-generation: swap
                    _replace(served, other_artifact)
                    runtime.reload_artifact()
            if "decision" in data:
                final_decision = data["decision"]
    assert streamed == pytest.approx(old, abs=1e-12)
    assert final_decision["method"] == "tad"
    new = _confidences(client, payload)
    assert new != pytest.approx(old, abs=1e-6)  # new requests use the new artifact
    # The decision log says which version decided: the one each request started with.
    logged = [json.loads(r.getMessage())["artifact_sha256"] for r in caplog.records if r.name == "tad.decisions"]
    assert logged == [old_sha, runtime.serving.manifest_sha256] and old_sha != logged[1]
