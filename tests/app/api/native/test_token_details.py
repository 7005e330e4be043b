"""Per-token extras of the native API: `top_logprobs` and `return_attention` (what the playground shows)."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from tests.app.api.native.test_streaming import read_events
from tests.app.api.test_errors import assert_error
from tests.app.service_client import CHAT, long_chat, make_client
from tests.conftest import N_LAGS


def _check_attention(tokens: list[dict]) -> None:
    for index, token in enumerate(tokens):
        lags = token["attention"]
        if index == 0 and lags is None:  # the generating convention (the tiny artifact's): no row of its own
            continue
        assert len(lags) == N_LAGS
        for lag, value in enumerate(lags, start=1):
            if lag > index:  # reaches before the answer: TAD reads nothing there
                assert value is None
            else:
                assert 0.0 <= value <= 1.0


def test_extras_are_off_by_default(client: TestClient) -> None:
    body = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 4}).json()
    assert all(token["top_logprobs"] is None and token["attention"] is None for token in body["tokens"])


def test_top_logprobs_and_attention_of_a_generated_answer(client: TestClient) -> None:
    messages = long_chat(client, 8)
    request = {"messages": messages, "max_new_tokens": 8, "top_logprobs": 3, "return_attention": True}
    body = client.post("/v1/generate", json=request).json()
    plain = client.post("/v1/generate", json={"messages": messages, "max_new_tokens": 8}).json()
    assert [t["id"] for t in body["tokens"]] == [t["id"] for t in plain["tokens"]]  # extras change nothing
    assert body["uncertainty"] == plain["uncertainty"]
    for token in body["tokens"]:
        alternatives = token["top_logprobs"]
        assert len(alternatives) == 3
        assert [a["logprob"] for a in alternatives] == sorted((a["logprob"] for a in alternatives), reverse=True)
        assert alternatives[0]["id"] == token["id"]  # greedy picks the most likely token
        assert alternatives[0]["logprob"] == pytest.approx(token["logprob"], abs=1e-5)
        assert all(isinstance(a["text"], str) for a in alternatives)
    _check_attention(body["tokens"])


def test_streamed_extras_equal_the_final_ones(client: TestClient) -> None:
    messages = long_chat(client, 8)
    request = {"messages": messages, "max_new_tokens": 8, "top_logprobs": 2, "return_attention": True}
    events = read_events(client, {**request, "stream": True})
    streamed = [data for name, data in events if name == "token"]
    final = events[-1][1]["tokens"]
    assert len(streamed) == len(final) == 8
    for event, token in zip(streamed, final, strict=True):
        assert [a["id"] for a in event["top_logprobs"]] == [a["id"] for a in token["top_logprobs"]]
        if event["attention"] is None or token["attention"] is None:
            assert event["attention"] == token["attention"]
            continue
        for ours, theirs in zip(event["attention"], token["attention"], strict=True):
            assert (ours is None and theirs is None) or ours == pytest.approx(theirs, abs=1e-6)
    _check_attention(streamed)


def test_score_returns_attention_for_a_given_answer(client: TestClient) -> None:
    generated = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 6, "return_attention": True})
    answer = generated.json()
    scored = client.post("/v1/score", json={"messages": CHAT, "response": answer["text"], "return_attention": True})
    tokens = scored.json()["tokens"]
    _check_attention(tokens)
    # The tiny tokenizer reads its own output back token for token (tests/fixtures/tiny_model.py): the same
    # tokens, so the same rows.
    assert [t["id"] for t in tokens] == [t["id"] for t in answer["tokens"]]
    for ours, theirs in zip(tokens[1:], answer["tokens"][1:], strict=True):
        assert [v is None for v in ours["attention"]] == [v is None for v in theirs["attention"]]
        assert all(
            math.isclose(a, b, abs_tol=1e-4)
            for a, b in zip(ours["attention"], theirs["attention"], strict=True)
            if a is not None
        )


@pytest.mark.parametrize(
    ("request_fields", "param"),
    [
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": -1}, "top_logprobs"),
        ({"top_logprobs": "3"}, "top_logprobs"),
        ({"return_attention": "yes"}, "return_attention"),
        ({"return_attentions": True}, "return_attentions"),
    ],
)
def test_bad_extras_are_422_naming_the_field(client: TestClient, request_fields: dict, param: str) -> None:
    response = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 2, **request_fields})
    assert_error(response, 422, param=param)


def test_top_logprobs_above_the_service_limit_and_on_score(service_settings: Settings) -> None:
    with make_client(service_settings, max_top_logprobs=2) as client:
        response = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 2, "top_logprobs": 3})
        assert_error(response, 422, param="top_logprobs")
        schema = client.get("/openapi.json").json()["components"]["schemas"]["GenerateRequest"]
        assert schema["properties"]["top_logprobs"]["maximum"] == 2
        # Scoring computes no alternatives: asking for them is an unknown field, not a silent null.
        scored = client.post("/v1/score", json={"messages": CHAT, "response": "paris", "top_logprobs": 2})
        assert_error(scored, 422, param="top_logprobs")


def test_attention_is_null_without_an_artifact(service_settings: Settings) -> None:
    with make_client(service_settings, artifact_dir=None) as client:
        request = {"messages": CHAT, "max_new_tokens": 3, "return_attention": True}
        body = client.post("/v1/generate", json=request).json()
        assert all(token["attention"] is None for token in body["tokens"])
        events = read_events(client, {**request, "stream": True})
        assert all(data["attention"] is None for name, data in events if name == "token")


def test_every_token_carries_its_bytes(client: TestClient) -> None:
    # The tiny tokenizer is word-level (no character is split), so each token's bytes spell its text;
    # split characters are tested with real tokenizers in tests/app/engine/test_token_bytes.py.
    tokens = client.post("/v1/score", json={"messages": CHAT, "response": "the capital of"}).json()["tokens"]
    assert [bytes(token["bytes"]).decode() for token in tokens] == [token["text"] for token in tokens]
    assert [token["text"] for token in tokens] == ["the", "capital", "of"]


def test_streamed_token_bytes_equal_the_final_ones(client: TestClient) -> None:
    request = {"messages": long_chat(client, 8), "max_new_tokens": 8, "top_logprobs": 2, "stream": True}
    events = read_events(client, request)
    streamed = [data for name, data in events if name == "token"]
    final = events[-1][1]["tokens"]
    assert [event["bytes"] for event in streamed] == [token["bytes"] for token in final]
    for event, token in zip(streamed, final, strict=True):
        assert [a["bytes"] for a in event["top_logprobs"]] == [a["bytes"] for a in token["top_logprobs"]]
        assert all(isinstance(a["bytes"], list) and a["bytes"] for a in token["top_logprobs"])
