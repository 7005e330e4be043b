"""Without a TAD regressor (no artifact, or a calibration-only one) every free score is still computed,
RAUQ and Attention Score included (attention is captured either way), on every route; only TAD is null."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from app.uncertainty.artifact import load_artifact
from tests.app.service_client import CHAT, long_chat, make_client

ATTENTION_METHODS = ("rauq", "attention_score")
TOKENS = 4  # at least two scored tokens: RAUQ and Attention Score are defined


@pytest.fixture(scope="module", params=["no-artifact", "calibration-only"])
def served(request: pytest.FixtureRequest, service_settings: Settings) -> Iterator[tuple[str, TestClient]]:
    artifact = None if request.param == "no-artifact" else request.getfixturevalue("tiny_calibration_artifact")
    with make_client(service_settings, artifact_dir=artifact) as client:
        yield request.param, client


@pytest.fixture(scope="module")
def messages(served: tuple[str, TestClient]) -> list[dict[str, str]]:
    return long_chat(served[1], TOKENS)


@pytest.fixture(scope="module")
def prompt(served: tuple[str, TestClient]) -> str:
    """A completion prompt the random tiny model answers with TOKENS tokens before any stop token."""
    for word in ("france", "river", "king", "ocean", "planet", "city", "queen", "moon", "island", "star"):
        text = f"the biggest {word} is"
        body = served[1].post("/v1/completions", json={"model": "model", "prompt": text, "max_tokens": TOKENS})
        if body.json()["choices"][0]["finish_reason"] == "length":
            return text
    raise AssertionError(f"no completion prompt runs to {TOKENS} tokens")


def _check_scores(scores: dict[str, Any]) -> None:
    assert scores["tad"] is None
    for method in ("msp", "perplexity", "mean_token_entropy", "max_token_uncertainty", *ATTENTION_METHODS):
        assert isinstance(scores[method], float), method


def _sse(client: TestClient, path: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    with client.stream("POST", path, json=payload) as response:
        assert response.status_code == 200
        return [
            json.loads(line.removeprefix("data: "))
            for line in response.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"
        ]


def test_native_generate_and_its_stream(served: tuple[str, TestClient], messages: list[dict[str, str]]) -> None:
    _, client = served
    body = client.post("/v1/generate", json={"messages": messages, "max_new_tokens": TOKENS}).json()
    assert body["usage"]["completion_tokens"] == TOKENS and body["tad_available"] is False
    _check_scores(body["uncertainty"])
    final = _sse(client, "/v1/generate", {"messages": messages, "max_new_tokens": TOKENS, "stream": True})[-1]
    _check_scores(final["uncertainty"])


def test_score_route(served: tuple[str, TestClient]) -> None:
    _, client = served
    body = client.post("/v1/score", json={"messages": CHAT, "response": "the capital is paris"}).json()
    _check_scores(body["uncertainty"])


def test_openai_routes_streamed_and_not(
    served: tuple[str, TestClient], messages: list[dict[str, str]], prompt: str
) -> None:
    _, client = served
    chat = {"model": "model", "messages": messages, "max_tokens": TOKENS}
    body = client.post("/v1/chat/completions", json=chat).json()
    _check_scores(body["uncertainty"]["sequence"])
    closing = [c for c in _sse(client, "/v1/chat/completions", {**chat, "stream": True}) if c["choices"]]
    _check_scores(closing[-1]["uncertainty"]["sequence"])
    text = {"model": "model", "prompt": prompt, "max_tokens": TOKENS}
    _check_scores(client.post("/v1/completions", json=text).json()["uncertainty"]["sequence"])
    closing = [c for c in _sse(client, "/v1/completions", {**text, "stream": True}) if c["choices"]]
    _check_scores(closing[-1]["uncertainty"]["sequence"])


def test_the_attention_methods_can_decide(served: tuple[str, TestClient], messages: list[dict[str, str]]) -> None:
    _, client = served
    for method in ATTENTION_METHODS:
        payload = {"messages": messages, "max_new_tokens": TOKENS, "policy": {"method": method, "threshold": 1e9}}
        decision = client.post("/v1/generate", json=payload).json()["decision"]
        assert decision["method"] == method and decision["accept"] is True


def test_tad_is_refused_with_its_reason(served: tuple[str, TestClient]) -> None:
    kind, client = served
    response = client.post(
        "/v1/generate", json={"messages": CHAT, "max_new_tokens": TOKENS, "policy": {"method": "tad"}}
    )
    assert response.status_code == 422
    reason = "calibration-only" if kind == "calibration-only" else "no TAD artifact"
    assert reason in response.json()["error"]["message"]
    info = client.get("/info").json()
    assert info["tad_available"] is False and reason.split()[-1] in info["tad_unavailable_reason"]


def test_a_calibration_only_artifact_decides_with_its_method_and_threshold(
    service_settings: Settings, tiny_calibration_artifact: Path
) -> None:
    manifest = load_artifact(tiny_calibration_artifact).manifest
    assert manifest.decision_method is not None and manifest.default_target is not None
    threshold = manifest.thresholds[manifest.decision_method][manifest.default_target].threshold
    with make_client(service_settings, artifact_dir=tiny_calibration_artifact) as client:
        decision = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": TOKENS}).json()["decision"]
    assert decision["method"] == manifest.decision_method.value
    assert decision["threshold"] == pytest.approx(threshold)
    assert decision["policy"] == f"calibrated:{manifest.default_target}"
