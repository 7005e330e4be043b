"""The runtime: which names a request's `model` may use; what loading leaves behind; the drift gauges'
thresholds."""

from __future__ import annotations

import gc
import json
import logging
import shutil
from pathlib import Path

import pytest

from app.engine.engine import Engine
from app.serving.metrics import ServiceMetrics
from app.serving.runtime import Runtime, StartupError
from app.settings import Settings
from app.uncertainty.artifact import load_artifact
from tests.app.service_client import make_client


def _runtime(engine: Engine, **settings: object) -> Runtime:
    runtime = Runtime(Settings(artifact_dir="", **settings), ServiceMetrics())
    runtime.engine = engine
    return runtime


def test_the_served_name_and_the_spec_it_was_started_with_both_name_the_model(engine: Engine) -> None:
    runtime = _runtime(engine, model="smollm2-135m")
    assert runtime.model_name == engine.identity.name != "smollm2-135m"
    assert runtime.serves(engine.identity.name)
    assert runtime.serves("smollm2-135m")
    assert not runtime.serves("gemma3-270m")
    assert not runtime.serves("")


def test_a_configured_served_name_is_the_only_name(engine: Engine) -> None:
    runtime = _runtime(engine, model="smollm2-135m", served_model_name="team-llm")
    assert runtime.model_name == "team-llm"
    assert runtime.serves("team-llm")
    assert not runtime.serves("smollm2-135m")
    assert not runtime.serves(engine.identity.name)


def test_what_loading_left_is_out_of_the_cyclic_collector_s_sight(service_settings: Settings) -> None:
    """A full collection walking the model, tokenizer and compiled code stalled every answer in flight for a
    third of a second on the tiny benchmark model (docs/performance.md, Serving speed)."""
    gc.unfreeze()
    with make_client(service_settings):
        assert gc.get_freeze_count() > 0


def test_the_drift_thresholds_follow_the_serving_artifact_swapped_in(engine: Engine, tiny_artifact: Path) -> None:
    """A reload swaps `serving` on its own thread: thresholds the event loop computed from the artifact before
    must not stay cached for the one after (they were reset by the reload, and a computation of the old ones
    still running on the loop could store them after the reset)."""
    runtime = _runtime(engine)
    without = runtime.method_thresholds()
    assert without["tad"] is None
    runtime.serving = Runtime._serving(load_artifact(tiny_artifact))  # the swap alone, as a reload makes it
    with_artifact = runtime.method_thresholds()
    assert with_artifact["tad"] is not None and with_artifact != without
    assert runtime.method_thresholds() is with_artifact  # computed once per serving artifact


def test_a_reject_target_the_artifact_has_not_calibrated_stops_the_start(service_settings: Settings) -> None:
    """A policy that cannot be applied is a configuration error, said at start, not a silent fallback."""
    settings = Settings(**{**service_settings.model_dump(), "reject_target": "error@0.01"})
    with pytest.raises(StartupError, match=r"TAD_REJECT_TARGET=error@0.01 is not calibrated in .* for tad"):
        Runtime(settings, ServiceMetrics()).load()
    artifact = load_artifact(service_settings.artifact_dir)
    for target in artifact.manifest.thresholds["tad"]:  # the ones it has are accepted
        calibrated = Settings(**{**service_settings.model_dump(), "reject_target": target})
        assert Runtime(calibrated, ServiceMetrics())._policy_problem(artifact) is None


def test_require_artifact_stops_the_start_without_a_usable_artifact(service_settings: Settings, tmp_path: Path) -> None:
    settings = Settings(**{**service_settings.model_dump(), "require_artifact": True, "artifact_dir": tmp_path})
    runtime = Runtime(settings, ServiceMetrics())
    with pytest.raises(StartupError, match=f"TAD_REQUIRE_ARTIFACT is set but no artifact at {tmp_path}"):
        runtime.load()
    assert runtime.engine is None  # refused before the model was loaded


def test_a_dtype_set_by_hand_other_than_the_artifacts_is_served_with_a_warning(
    service_settings: Settings, tiny_artifact: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = Path(shutil.copytree(tiny_artifact, tmp_path / "bf16-answers"))
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "dtype": "bfloat16"}))
    with (
        caplog.at_level(logging.WARNING, logger="app.serving.runtime"),
        make_client(service_settings, artifact_dir=folder, dtype="float32") as client,
    ):
        assert client.get("/info").json()["dtype"] == "float32"
    assert "the model runs in float32 but artifact" in caplog.text
    assert "trained on answers generated in bfloat16" in caplog.text
