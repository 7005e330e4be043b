"""P(True): a policy deciding with it runs one more pass over the question and the answer; nothing else does."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.serving.self_check import CHECK_PROMPT, YES
from app.settings import Settings
from app.uncertainty.artifact import load_artifact
from app.uncertainty.methods import BASELINES, REGISTRY, Method
from tests.app.api.native.test_streaming import read_events
from tests.app.service_client import CHAT, make_client

P_TRUE_POLICY = {"method": "p_true", "threshold": 0.5}


def test_p_true_is_registered_but_not_a_trace_method_training_measures() -> None:
    assert REGISTRY["p_true"].needs_check_pass
    assert Method("p_true") not in BASELINES


def test_a_policy_deciding_with_p_true_gets_one_minus_the_probability_of_yes(client: TestClient) -> None:
    body = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 6, "policy": P_TRUE_POLICY}).json()
    p_true = body["uncertainty"]["p_true"]
    assert p_true is not None and 0.0 <= p_true <= 1.0
    decision = body["decision"]
    assert decision["method"] == "p_true" and decision["score"] == pytest.approx(p_true)
    assert decision["accept"] is (p_true <= 0.5)
    # The same number from the scoring route: "Yes" teacher-forced after the check prompt.
    check = CHECK_PROMPT.format(question=CHAT[-1]["content"], answer=body["text"])
    scored = client.post("/v1/score", json={"messages": [{"role": "user", "content": check}], "response": YES}).json()
    assert p_true == pytest.approx(1.0 - math.exp(scored["tokens"][0]["logprob"]), abs=1e-5)


def test_without_it_no_check_pass_runs_and_p_true_is_null(client: TestClient) -> None:
    body = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 6}).json()
    assert body["uncertainty"]["p_true"] is None and body["decision"]["method"] != "p_true"


def test_a_streamed_answer_is_decided_with_p_true_at_its_end(client: TestClient) -> None:
    payload = {"messages": CHAT, "max_new_tokens": 6, "policy": P_TRUE_POLICY}
    final = read_events(client, {**payload, "stream": True})[-1]
    plain = client.post("/v1/generate", json=payload).json()
    assert final[0] == "final" and final[1]["decision"] == plain["decision"]
    assert final[1]["uncertainty"]["p_true"] == pytest.approx(plain["uncertainty"]["p_true"])


def test_a_streamed_answer_sends_its_tokens_before_the_check_pass_runs(client: TestClient) -> None:
    """The check is a scoring pass that may wait its turn: a keep-alive first sends every token written so
    far (the last one arrives with the answer's end, and would otherwise wait for the check)."""
    payload = {"messages": CHAT, "max_new_tokens": 6, "policy": P_TRUE_POLICY, "stream": True}
    with client.stream("POST", "/v1/generate", json=payload) as response:
        lines = [line for line in response.iter_lines() if line]
    assert "event: token" in lines
    last_token, keep_alive, final = (
        max(i for i, line in enumerate(lines) if line == "event: token"),
        lines.index(": keep-alive"),
        lines.index("event: final"),
    )
    assert last_token < keep_alive < final


def test_a_target_for_p_true_needs_calibrated_thresholds(client: TestClient) -> None:
    response = client.post(
        "/v1/generate",
        json={"messages": CHAT, "max_new_tokens": 2, "policy": {"method": "p_true", "target": "default"}},
    )
    assert response.status_code == 422 and "p_true" in response.json()["error"]["message"]


def test_a_service_deciding_with_p_true_runs_the_check_on_every_answer(service_settings: Settings) -> None:
    with make_client(service_settings, reject_method="p_true", reject_threshold=0.25, reject_target=None) as client:
        body = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 4}).json()
    assert body["decision"]["method"] == "p_true" and body["uncertainty"]["p_true"] is not None
    assert body["decision"]["accept"] is (body["uncertainty"]["p_true"] <= 0.25)


def test_an_artifact_deciding_with_p_true_checks_every_answer_at_its_certified_threshold(
    service_settings: Settings, tiny_p_true_artifact: Path
) -> None:
    manifest = load_artifact(tiny_p_true_artifact).manifest
    assert manifest.decision_method == Method("p_true") and manifest.default_target is not None
    threshold = manifest.thresholds[Method("p_true")][manifest.default_target].threshold
    with make_client(service_settings, artifact_dir=tiny_p_true_artifact) as client:
        body = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 6}).json()
    decision, p_true = body["decision"], body["uncertainty"]["p_true"]
    assert decision["method"] == "p_true" and decision["policy"] == f"calibrated:{manifest.default_target}"
    assert decision["threshold"] == pytest.approx(threshold) and decision["score"] == pytest.approx(p_true)
    assert decision["accept"] is (p_true <= threshold)
