"""Server-sent events: one event per token with its TAD confidence, then the final answer."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tests.app.service_client import CHAT, long_chat


def read_events(client: TestClient, payload: dict) -> list[tuple[str, dict]]:
    events = []
    with client.stream("POST", "/v1/generate", json=payload) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
    return events


def test_stream_matches_the_non_streamed_answer(client: TestClient) -> None:
    payload = {"messages": CHAT, "max_new_tokens": 9}
    events = read_events(client, {**payload, "stream": True})
    tokens = [data for name, data in events if name == "token"]
    final = events[-1]
    assert final[0] == "final" and [name for name, _ in events[:-1]] == ["token"] * len(tokens)
    assert [t["index"] for t in tokens] == list(range(len(tokens)))
    plain = client.post("/v1/generate", json=payload).json()
    assert final[1]["text"] == plain["text"] and final[1]["decision"] == plain["decision"]
    assert [t["id"] for t in tokens] == [t["id"] for t in plain["tokens"]]
    for streamed, whole in zip(tokens, plain["tokens"], strict=True):
        assert streamed["confidence"] == pytest.approx(whole["confidence"], abs=1e-9)
        assert streamed["logprob"] == pytest.approx(whole["logprob"], abs=1e-6)


def test_stream_without_final_tokens_still_streams_their_details(client: TestClient) -> None:
    payload = {"messages": CHAT, "max_new_tokens": 3, "return_tokens": False, "top_logprobs": 2, "stream": True}
    events = read_events(client, payload)
    tokens = [data for name, data in events if name == "token"]
    assert tokens and all(len(token["top_logprobs"]) == 2 for token in tokens)
    assert events[-1][0] == "final" and events[-1][1]["tokens"] is None


def test_stream_early_stop(client: TestClient) -> None:
    payload = {
        "messages": long_chat(client, 30),
        "max_new_tokens": 30,
        "stream": True,
        "early_stop": True,
        "policy": {"method": "tad", "threshold": 0.0},
    }
    events = read_events(client, payload)
    final = events[-1][1]
    assert final["finish_reason"] == "uncertainty" and not final["decision"]["accept"]
    assert len([e for e in events if e[0] == "token"]) == final["usage"]["completion_tokens"] < 30


def test_stream_never_shows_a_stop_string(client: TestClient) -> None:
    messages = long_chat(client, 20)
    free = client.post("/v1/generate", json={"messages": messages, "max_new_tokens": 20}).json()
    words = free["text"].split()
    stop = " ".join(words[5:9])  # a four-word stop string, spanning tokens
    events = read_events(client, {"messages": messages, "max_new_tokens": 20, "stop": [stop], "stream": True})
    final = events[-1][1]
    streamed = " ".join(data["text"] for name, data in events if name == "token")
    assert final["finish_reason"] == "stop" and stop not in final["text"]
    assert stop not in streamed
    # Usage counts every token generated, as vLLM's does: the model stopped at the stop string's last word,
    # the ninth (this tokenizer's tokens are words).
    assert len(free["tokens"]) == len(words) and final["usage"]["completion_tokens"] == (generated := 9)
    assert len([e for e in events if e[0] == "token"]) == len(final["tokens"]) < generated


def test_streamed_pieces_add_up_to_the_final_text(client: TestClient) -> None:
    messages = long_chat(client, 16)
    free = client.post("/v1/generate", json={"messages": messages, "max_new_tokens": 16}).json()
    stop = free["text"].split()[4][:2]  # may start inside a token
    for extra in ({}, {"stop": [stop]}):
        events = read_events(client, {"messages": messages, "max_new_tokens": 16, "stream": True, **extra})
        pieces = "".join(data["text"] for name, data in events if name == "token")
        assert pieces == events[-1][1]["text"]
