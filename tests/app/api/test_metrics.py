"""The Prometheus exposition, parsed with prometheus_client's own parser."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.settings import Settings
from tests.app.live_server import live_server
from tests.app.service_client import CHAT, make_client


def samples(client: httpx.Client) -> dict[str, list]:
    """`client`: the test client, or an httpx client with a live server's `base_url`."""
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def value(found: dict[str, list], name: str, **labels: str) -> float:
    return sum(s.value for s in found.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_count_what_the_service_did(client: TestClient) -> None:
    before = samples(client)
    for _ in range(3):
        assert client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 4}).status_code == 200
    assert client.post("/v1/generate", json={"prompt": ""}).status_code == 422
    # Refused by the body limit before routing: still counted under the route it was sent to.
    oversized = {"prompt": "x" * (client.app.state.runtime.settings.max_body_bytes + 1)}
    assert client.post("/v1/generate", json=oversized).status_code == 413
    assert client.post("/v1/no-such-route", json={}).status_code == 404
    assert client.get("/playground/static/app.js").status_code == 200
    assert client.get("/openapi.json").status_code == 200
    after = samples(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("tad_requests_total", route="/v1/generate", status="200") == 3
    assert delta("tad_requests_total", route="/v1/generate", status="422") == 1
    assert delta("tad_requests_total", route="/v1/generate", status="413") == 1
    assert delta("tad_requests_total", route="unmatched", status="404") == 1
    assert delta("tad_requests_total", route="/playground/static", status="200") == 1  # by its mount
    assert delta("tad_requests_total", route="/openapi.json", status="200") == 1  # FastAPI's own route
    assert delta("tad_generated_tokens_total") == 12
    assert delta("tad_request_duration_seconds_count", route="/v1/generate") == 5
    assert delta("tad_time_per_output_token_seconds_count") == 3
    assert delta("tad_time_to_first_token_seconds_count") == 3
    assert delta("tad_queue_time_seconds_count") == 3
    assert delta("tad_decisions_total") == 3
    for method in ("tad", "msp", "perplexity", "mean_token_entropy"):
        assert delta("tad_sequence_uncertainty_count", method=method) == 3
    rate = value(after, "tad_rolling_rejection_rate", method="tad")
    assert 0.0 <= rate <= 1.0 and "tad_rolling_rejection_rate" in after
    assert value(after, "tad_batch_size_count") > 0
    assert value(after, "tad_requests_in_flight") == 0
    assert value(after, "tad_queue_depth") == 0 and value(after, "tad_running_requests") == 0
    assert value(after, "tad_ready") == 1
    assert value(after, "tad_model_info", model="model", artifact="tiny-tad") == 1
    assert value(after, "tad_decision_method", method="tad") == 1 and len(after["tad_decision_method"]) == 1


def test_scored_answers_are_decisions_but_not_the_served_answers_drift(client: TestClient) -> None:
    before = samples(client)
    for wrong in ("Berlin", "Madrid", "the moon"):
        scored = client.post("/v1/score", json={"messages": CHAT, "response": wrong})
        assert scored.status_code == 200
    after = samples(client)
    assert value(after, "tad_decisions_total") - value(before, "tad_decisions_total") == 3
    assert value(after, "tad_sequence_uncertainty_count") == value(before, "tad_sequence_uncertainty_count")
    assert after.get("tad_rolling_rejection_rate") == before.get("tad_rolling_rejection_rate")


def test_an_unexpected_error_in_a_generation_is_counted_as_failed(
    service_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.serving.service import GenerationService

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a defect")

    monkeypatch.setattr(GenerationService, "conclude", broken)
    with make_client(service_settings, raise_server_exceptions=False) as client:
        assert client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 2}).status_code == 500
        failed = value(samples(client), "tad_failed_generations_total", error_type="internal_error")
    assert failed == 1


def test_a_generation_past_its_deadline_still_counts_its_wait(service_settings: Settings) -> None:
    """Under overload most requests time out in the queue: latency histograms of the answered ones alone would
    look healthy."""
    with make_client(service_settings, request_timeout_s=0.001) as client:
        before = value(samples(client), "tad_queue_time_seconds_count")
        response = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 4})
        assert response.status_code == 504, response.text
        after = samples(client)
    assert value(after, "tad_queue_time_seconds_count") == before + 1
    assert value(after, "tad_failed_generations_total", error_type="deadline_exceeded") == 1


def test_the_rolling_rejection_window_is_the_configured_one(service_settings: Settings) -> None:
    """`TAD_REJECTION_RATE_WINDOW`: the drift alert's window holds that many answers, not the default."""
    with make_client(service_settings, rejection_rate_window=3) as client:
        for _ in range(5):
            assert client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 2}).status_code == 200
        assert value(samples(client), "tad_rolling_rejection_answers", method="tad") == 3


def test_a_request_generating_is_counted_as_running_until_it_ends(service_settings: Settings, slow_model: Path) -> None:
    """On a real socket: the test client runs a stream to its end before it returns its first line."""
    settings = service_settings.model_copy(
        update={"model": str(slow_model), "artifact_dir": None, "max_new_tokens_limit": 1500}
    )

    with live_server(settings) as url, httpx.Client(base_url=url, timeout=60) as http:
        request = {"prompt": "the", "max_new_tokens": 1500, "stream": True}
        with httpx.stream("POST", f"{url}/v1/generate", json=request, timeout=60) as response:
            lines = response.iter_lines()  # kept: a generator dropped closes the stream, and the server drops the row
            while not next(lines).startswith("event: token"):
                pass
            assert value(samples(http), "tad_running_requests") == 1  # while its tokens come
        deadline = time.monotonic() + 30  # the stream closed: the worker drops the row at its next step
        while value(samples(http), "tad_running_requests") != 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
