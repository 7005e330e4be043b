"""Request ids on every response, and the decision log that names them."""

from __future__ import annotations

import json
import logging
import re

import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from tests.app.service_client import CHAT, make_client


def decisions(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "tad.decisions"]


def test_every_response_carries_an_id_the_clients_when_usable(client: TestClient) -> None:
    generated = client.get("/health").headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated) and client.get("/health").headers["x-request-id"] != generated
    assert client.get("/health", headers={"X-Request-ID": "trace-42/a:b"}).headers["x-request-id"] == "trace-42/a:b"
    for unusable in ("has space", "x" * 129, "line\tbreak"):
        echoed = client.get("/health", headers={"X-Request-ID": unusable}).headers["x-request-id"]
        assert echoed != unusable and re.fullmatch(r"[0-9a-f]{32}", echoed)
    refused = client.post("/v1/generate", json={"prompt": ""}, headers={"X-Request-ID": "bad-input"})
    assert refused.status_code == 422 and refused.headers["x-request-id"] == "bad-input"
    assert client.get("/no-such-route").headers["x-request-id"]


def test_a_body_over_the_limit_still_gets_its_id(service_settings: Settings) -> None:
    with make_client(service_settings, max_body_bytes=100) as client:
        response = client.post("/v1/generate", content=b"x" * 500, headers={"X-Request-ID": "too-big"})
        assert response.status_code == 413 and response.headers["x-request-id"] == "too-big"


def test_an_unexpected_error_still_gets_its_id_in_the_response_and_the_log(
    service_settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from app.api.ops import routes

    def broken(runtime: object) -> None:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(routes, "_artifact_summary", broken)
    with make_client(service_settings, raise_server_exceptions=False) as client:
        response = client.get("/info", headers={"X-Request-ID": "boom-7"})
    assert response.status_code == 500 and response.headers["x-request-id"] == "boom-7"
    assert response.json()["error"]["type"] == "internal_error" and "secret" not in response.text
    logged = [r.getMessage() for r in caplog.records if r.name == "app.api.errors"]
    assert any("boom-7" in line for line in logged)


def test_each_decision_is_logged_with_the_request_id_and_no_text(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tad.decisions")
    response = client.post(
        "/v1/generate", json={"messages": CHAT, "max_new_tokens": 5}, headers={"X-Request-ID": "gen-1"}
    )
    body = response.json()
    scored = client.post(
        "/v1/score", json={"messages": CHAT, "response": body["text"]}, headers={"X-Request-ID": "s-1"}
    )
    generated, score = decisions(caplog)
    assert generated["request_id"] == "gen-1" and generated["kind"] == "generate"
    assert generated["accept"] == body["decision"]["accept"] and generated["score"] == body["decision"]["score"]
    assert generated["answer_tokens"] == body["usage"]["completion_tokens"]
    assert generated["prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert generated["finish_reason"] == body["finish_reason"] and generated["total_s"] >= generated["queued_s"] >= 0
    assert score["request_id"] == "s-1" and score["kind"] == "score"
    assert score["score"] == pytest.approx(scored.json()["decision"]["score"])
    for record in (generated, score):
        assert body["text"] not in json.dumps(record) and "text" not in record


def test_the_decision_log_can_be_turned_off(service_settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tad.decisions")
    with make_client(service_settings, decision_log=False) as client:
        assert client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 3}).status_code == 200
    assert decisions(caplog) == []
