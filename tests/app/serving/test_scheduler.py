"""Requests that arrive together are batched, and get what they would get alone."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.settings import Settings
from tests.app.service_client import make_client

PROMPTS = [
    {"messages": [{"role": "user", "content": text}], "max_new_tokens": n}
    for text, n in (
        ("what is the capital of france ?", 12),
        ("who", 5),
        ("name the largest river in africa and europe , then the oldest city of asia", 16),
        ("the sun", 9),
        ("one two three", 3),
        ("is paris in europe ?", 14),
    )
] + [{"prompt": "the moon and the", "max_new_tokens": 10, "temperature": 1.0, "seed": 7}]


def _max_batch(client: TestClient) -> float:
    text = client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        if family.name == "tad_batch_size":
            buckets = [(s.labels["le"], s.value) for s in family.samples if s.name.endswith("_bucket")]
            return min(float(le) for le, count in buckets if count == max(c for _, c in buckets))
    raise AssertionError("no batch size histogram")


def test_concurrent_requests_equal_sequential_ones(service_settings: Settings) -> None:
    with make_client(service_settings, batch_window_ms=50.0) as client:
        sequential = [client.post("/v1/generate", json=p).json() for p in PROMPTS]
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            concurrent = list(pool.map(lambda p: client.post("/v1/generate", json=p).json(), PROMPTS))
        for alone, together in zip(sequential, concurrent, strict=True):
            assert together["text"] == alone["text"]
            assert [t["id"] for t in together["tokens"]] == [t["id"] for t in alone["tokens"]]
            for key, expected in alone["uncertainty"].items():
                # float32 log-probabilities: a rare token's -log p near 15 is exact to about 1e-6 relative.
                if expected is None:  # a method the artifact does not have
                    assert together["uncertainty"][key] is None
                else:
                    assert together["uncertainty"][key] == pytest.approx(expected, rel=1e-6, abs=1e-5)
            assert together["decision"]["accept"] == alone["decision"]["accept"]
        assert _max_batch(client) > 1  # they really ran together


def test_cancelled_stream_frees_its_slot(service_settings: Settings) -> None:
    with make_client(
        service_settings, max_batch_size=1, max_queue=0, max_new_tokens_limit=2000, max_prompt_tokens=2000
    ) as client:
        with client.stream("POST", "/v1/generate", json={"prompt": "the", "max_new_tokens": 1500, "stream": True}) as s:
            for line in s.iter_lines():
                if line.startswith("event: token"):
                    break  # the client goes away after the first token
        runtime = client.app.state.runtime
        deadline = time.monotonic() + 20
        while runtime.scheduler.unanswered and time.monotonic() < deadline:
            time.sleep(0.02)
        assert runtime.scheduler.unanswered == 0
        assert client.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 2}).status_code == 200


def test_a_client_that_goes_away_has_its_generation_cancelled(slow_model, service_settings: Settings) -> None:
    import httpx

    from tests.app.live_server import live_server

    settings = service_settings.model_copy(
        update={"model": str(slow_model), "artifact_dir": None, "max_new_tokens_limit": 1500}
    )
    with live_server(settings) as url:
        body = {"prompt": "the capital of", "max_new_tokens": 1500}
        started = time.monotonic()
        assert httpx.post(f"{url}/v1/generate", json=body, timeout=120).status_code == 200
        full = time.monotonic() - started
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/generate", json=body, timeout=full / 10)
        gone = time.monotonic()
        while time.monotonic() - gone < full:
            metrics = httpx.get(f"{url}/metrics").text
            if "tad_requests_in_flight 0.0" in metrics:
                break
            time.sleep(0.05)
        assert time.monotonic() - gone < full / 2, "the abandoned generation ran on"
