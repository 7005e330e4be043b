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

from app.settings import Settings
from app.uncertainty.artifact import ArtifactError, read_manifest
from tests.app.service_client import long_chat, make_client

RELOAD = "/admin/reload-artifact"


@pytest.fixture(scope="module")
def other_artifact(tmp_path_factory: pytest.TempPathFactory, tiny_runs: dict[str, Path], tiny_artifact: Path) -> Path:
    """A second artifact for the same model: another regressor (same lags and convention)."""
    from training.fit.options import FitOptions
    from training.fit.pipeline import run_fit

    convention = read_manifest(tiny_artifact).features.convention
    out = tmp_path_factory.mktemp("other") / "other-tad"
    run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, alphas=(1000.0,), conventions=(convention,)))
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
    client.post("/v1/generate", json={"prompt": "hello", "max_new_tokens": 3})
    assert "tad_rolling_rejection_rate{" in client.get("/metrics").text
    _replace(served, other_artifact)
    response = client.post(RELOAD)
    assert response.status_code == 200, response.text
    after = response.json()["manifest_sha256"]
    assert after != before and client.get("/info").json()["artifact"]["manifest_sha256"] == after
    metrics = client.get("/metrics").text
    assert f'manifest_sha256="{after}"' in metrics and f'manifest_sha256="{before}"' not in metrics
    assert 'tad_artifact_reloads_total{outcome="loaded"} 1.0' in metrics
    assert "tad_rolling_rejection_rate{" not in metrics  # answers judged on the old thresholds are forgotten


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
    assert str(served) not in response.text and "serving: sha256 of regressor.joblib" in response.text  # no path
    assert client.get("/info").json()["artifact"]["manifest_sha256"] == before
    assert _confidences(client, payload) == serving_before
    assert 'tad_artifact_reloads_total{outcome="refused"} 1.0' in client.get("/metrics").text


def test_an_artifact_that_fails_to_unpickle_is_a_409_not_a_500(
    client: TestClient,
    served: Path,
    other_artifact: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The hashes match, but unpickling breaks (e.g. a regressor saved by another scikit-learn)."""
    import app.serving.runtime as runtime_module

    def broken(*args: object, **kwargs: object) -> None:
        raise ModuleNotFoundError("No module named 'sklearn.linear_model._gone'")

    before = client.get("/info").json()["artifact"]["manifest_sha256"]
    _replace(served, other_artifact)
    monkeypatch.setattr(runtime_module, "load_artifact", broken)
    response = client.post(RELOAD)
    message = response.json()["error"]["message"]
    # The exception is the server log's (with its traceback), not the client's: not even its class.
    assert response.status_code == 409 and message.endswith("the artifact could not be loaded; the server log says why")
    assert "ModuleNotFoundError" not in message and "sklearn.linear_model._gone" in caplog.text
    assert client.get("/info").json()["artifact"]["manifest_sha256"] == before
    assert 'tad_artifact_reloads_total{outcome="refused"} 1.0' in client.get("/metrics").text


def test_a_regressor_file_holding_no_regressor_is_refused_and_tad_keeps_working(
    client: TestClient, served: Path
) -> None:
    # Hashes that match but a pickle of something else: refused at reload, not a 500 on every request after.
    import joblib

    from app.uncertainty.artifact import write_manifest

    payload = {"messages": long_chat(client, 8), "max_new_tokens": 8}
    serving_before = _confidences(client, payload)
    joblib.dump(5, served / "regressor.joblib")
    write_manifest(served, read_manifest(served))
    response = client.post(RELOAD)
    assert response.status_code == 409, response.text
    assert "does not hold a regressor" in response.json()["error"]["message"]
    assert _confidences(client, payload) == serving_before


def test_an_unreadable_manifest_is_refused_without_parser_or_pydantic_text(client: TestClient, served: Path) -> None:
    (served / "manifest.json").write_text("{not json")
    message = client.post(RELOAD).json()["error"]["message"]
    assert "is not valid JSON (line 1, column 2)" in message and "Expecting" not in message
    (served / "manifest.json").write_text("[]")
    message = client.post(RELOAD).json()["error"]["message"]
    assert "invalid" in message and "pydantic" not in message and "input_value" not in message
    assert "the manifest: Input should be an object" in message and "instance of" not in message
    (served / "manifest.json").write_bytes(b"\xff\xfe\x00binary")
    message = client.post(RELOAD).json()["error"]["message"]
    assert "the artifact could not be loaded; the server log says why" in message and "Error" not in message


def test_a_manifest_whose_feature_sizes_contradict_its_lags_is_refused(client: TestClient, served: Path) -> None:
    manifest = json.loads((served / "manifest.json").read_text())
    manifest["features"]["n_lags"] += 1
    (served / "manifest.json").write_text(json.dumps(manifest))
    response = client.post(RELOAD)
    assert response.status_code == 409
    assert "feature sizes in the manifest do not match its n_lags" in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def capture_artifacts(tmp_path_factory: pytest.TempPathFactory, tiny_runs: dict[str, Path]) -> dict[str, Path]:
    """Valid artifacts of the tiny model that need other captures: the generating convention with the runs' lags
    (what the service below starts with), with fewer lags, and the consuming convention."""
    from app.uncertainty.features import Convention
    from training.fit.options import FitOptions
    from training.fit.pipeline import run_fit

    kinds = {
        "generating": {"conventions": (Convention.GENERATING,)},
        "fewer lags": {"conventions": (Convention.GENERATING,), "n_lags": 2},
        "consuming": {"conventions": (Convention.CONSUMING,)},
    }
    folder = tmp_path_factory.mktemp("capture")
    for name, options in kinds.items():
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=folder / name, alphas=(1.0,), **options))  # type: ignore[arg-type]
    return {name: folder / name for name in kinds}


@pytest.mark.parametrize(
    ("case", "refusal"),
    [
        ("fewer lags", "reads 2 lags, the running engine captures 4: restart the service"),
        ("consuming", "uses the consuming convention, which needs the last token's own step row"),
        ("bfloat16", "was trained on answers generated in bfloat16, the running model computes in float32: restart"),
    ],
)
def test_an_artifact_the_running_engine_cannot_feed_is_refused(
    case: str, refusal: str, service_settings: Settings, capture_artifacts: dict[str, Path], tmp_path: Path
) -> None:
    """Valid artifacts that need another capture than the running engine's (its lags, the last token's row, its
    dtype under TAD_DTYPE=auto) wait for a restart; the one serving stays."""
    served = Path(shutil.copytree(capture_artifacts["generating"], tmp_path / "serving"))
    with make_client(service_settings, artifact_dir=served, dtype="auto") as client:
        before = client.get("/info").json()["artifact"]["manifest_sha256"]
        if case == "bfloat16":
            manifest = json.loads((served / "manifest.json").read_text())
            (served / "manifest.json").write_text(json.dumps({**manifest, "dtype": "bfloat16"}))
        else:
            _replace(served, capture_artifacts[case])
        response = client.post(RELOAD)
        assert response.status_code == 409
        assert refusal in response.json()["error"]["message"]
        assert client.get("/info").json()["artifact"]["manifest_sha256"] == before


@pytest.fixture
def studied_artifact(tmp_path: Path, tiny_artifact: Path) -> Path:
    """A copy of the artifact whose manifest says its features include per-token statistics, as `fit --extra-stats`
    of earlier versions wrote it: this code would score it on other features than it was fitted on."""
    folder = Path(shutil.copytree(tiny_artifact, tmp_path / "studied"))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["features"]["extra_stats"] = ["entropy", "study_a", "study_b", "study_c"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


STUDIED = r"reads per-token statistics as features \(entropy, study_a, study_b and 1 more\)"


def test_an_artifact_reading_extra_statistics_is_refused_at_start(
    service_settings: Settings, studied_artifact: Path
) -> None:
    from app.serving.metrics import ServiceMetrics
    from app.serving.runtime import Runtime

    settings = service_settings.model_copy(update={"artifact_dir": studied_artifact})
    with pytest.raises(ArtifactError, match=STUDIED):
        Runtime(settings, ServiceMetrics()).load()


def test_an_artifact_reading_extra_statistics_is_refused_on_reload(
    client: TestClient, served: Path, studied_artifact: Path
) -> None:
    payload = {"messages": [{"role": "user", "content": "Hi"}], "max_new_tokens": 4, "temperature": 0}
    before = _confidences(client, payload)
    _replace(served, studied_artifact)
    response = client.post(RELOAD)
    assert response.status_code == 409
    assert re.search(STUDIED, response.json()["error"]["message"])
    assert _confidences(client, payload) == before


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
    logged = [json.loads(r.getMessage())["manifest_sha256"] for r in caplog.records if r.name == "tad.decisions"]
    assert logged == [old_sha, runtime.serving.manifest_sha256] and old_sha != logged[1]


def test_an_artifact_without_the_configured_reject_target_is_refused(
    service_settings: Settings, served: Path, other_artifact: Path
) -> None:
    """TAD_REJECT_TARGET names a calibrated target; an uncalibrated artifact swapped in would leave the policy
    without its threshold."""
    target = next(iter(read_manifest(served).thresholds["tad"]))
    with make_client(service_settings, artifact_dir=served, reject_target=target) as client:
        _replace(served, other_artifact)
        response = client.post(RELOAD)
        assert response.status_code == 409
        assert f"TAD_REJECT_TARGET={target} is not calibrated in {served.name} " in response.json()["error"]["message"]


def test_a_page_from_another_origin_may_not_reload_the_artifact(
    service_settings: Settings, served: Path, client: TestClient
) -> None:
    """A body-less POST needs no CORS preflight: any page a user of the service opens could make the browser
    send it. A browser says where the page is from; origins TAD_CORS_ORIGINS lists may, as clients without one."""
    refused = client.post(RELOAD, headers={"Origin": "https://elsewhere.example"})
    assert refused.status_code == 403 and refused.json()["error"]["param"] == "Origin"
    assert client.post(RELOAD, headers={"Origin": "null"}).status_code == 403  # a sandboxed page, a file
    assert "tad_artifact_reloads_total{" not in client.get("/metrics").text  # refused before any reload began
    assert client.post(RELOAD).status_code == 200  # curl, a script: no Origin
    with make_client(service_settings, artifact_dir=served, cors_origins=["https://ops.example"]) as listed:
        assert listed.post(RELOAD, headers={"Origin": "https://ops.example"}).status_code == 200


def test_a_pinned_manifest_is_served_and_any_other_refused_at_start_and_on_reload(
    service_settings: Settings, served: Path, other_artifact: Path
) -> None:
    """`TAD_ARTIFACT_MANIFEST_SHA256`: the service itself checks the pin, at start and at each reload."""
    from app.hashing import file_sha256
    from app.serving.metrics import ServiceMetrics
    from app.serving.runtime import Runtime

    pin = file_sha256(served / "manifest.json")
    with make_client(service_settings, artifact_dir=served, artifact_manifest_sha256=pin) as client:
        assert client.get("/info").json()["artifact"]["manifest_sha256"] == pin
        _replace(served, other_artifact)  # another artifact, sound, but not the one pinned
        refused = client.post(RELOAD)
        assert refused.status_code == 409 and "is not the pinned" in refused.json()["error"]["message"]
        assert client.get("/info").json()["artifact"]["manifest_sha256"] == pin
    settings = service_settings.model_copy(update={"artifact_dir": served, "artifact_manifest_sha256": pin})
    with pytest.raises(ArtifactError, match="is not the pinned"):
        Runtime(settings, ServiceMetrics()).load()
