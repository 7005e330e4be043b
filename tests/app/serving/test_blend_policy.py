"""An artifact with a decision blend: the service decides with `tad_blend` by default, and refuses a blend
that `calibrate` has not given thresholds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.serving.metrics import ServiceMetrics
from app.serving.runtime import Runtime, StartupError
from app.settings import Settings
from app.uncertainty.methods import Method
from tests.app.service_client import CHAT, make_client


def test_the_blend_decides_by_default_and_scores_the_other_methods_of_the_answer(
    service_settings: Settings, tiny_blended_artifact: Path
) -> None:
    settings = service_settings.model_copy(update={"artifact_dir": tiny_blended_artifact})
    manifest = json.loads((tiny_blended_artifact / "manifest.json").read_text())
    terms = manifest["blend"]["terms"]
    with make_client(settings) as client:
        body = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 6}).json()
        info = client.get("/info").json()
        explicit = client.post(
            "/v1/generate", json={"messages": CHAT, "max_new_tokens": 6, "policy": {"method": "tad"}}
        ).json()
    scores = body["uncertainty"]
    expected = sum(t["weight"] * (scores[t["method"]] - t["mean"]) / t["scale"] for t in terms)
    assert scores["tad_blend"] == pytest.approx(expected)
    decision = body["decision"]
    threshold = manifest["thresholds"]["tad_blend"][manifest["default_target"]]["threshold"]
    assert decision["method"] == "tad_blend" and decision["threshold"] == pytest.approx(threshold)
    assert decision["score"] == pytest.approx(scores["tad_blend"])
    assert info["policy"]["method"] == "tad_blend" and info["artifact"]["decision_method"] == "tad_blend"
    assert info["artifact"]["blend"]["terms"][0]["method"] == "tad"
    assert explicit["decision"]["method"] == "tad"  # a request can still name TAD alone


def test_a_blend_without_thresholds_is_refused_at_start(
    service_settings: Settings, tiny_blended_artifact: Path, tmp_path: Path
) -> None:
    uncalibrated = tmp_path / "uncalibrated"
    shutil.copytree(tiny_blended_artifact, uncalibrated)
    path = uncalibrated / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["thresholds"]["tad_blend"]
    path.write_text(json.dumps(manifest))
    settings = service_settings.model_copy(update={"artifact_dir": uncalibrated})
    runtime = Runtime(settings, ServiceMetrics())
    with pytest.raises(StartupError, match="not calibrated for tad_blend"):
        runtime.load()


def test_a_configured_blend_the_artifact_lacks_is_refused_at_start(service_settings: Settings) -> None:
    """Not silently answered with the fallback (which would accept everything)."""
    settings = service_settings.model_copy(update={"reject_method": Method.TAD_BLEND})  # the tiny artifact has none
    with pytest.raises(StartupError, match="TAD_REJECT_METHOD=tad_blend cannot decide: the artifact has no decision"):
        Runtime(settings, ServiceMetrics()).load()
