"""The withhold action: a rejected answer's text never reaches the client, on either API, streamed or not."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from fastapi.testclient import TestClient

from app.settings import RejectAction, Settings
from tests.app.api.native.test_streaming import read_events
from tests.app.live_server import live_server
from tests.app.service_client import CHAT, invalid_status, long_chat, make_client

MESSAGE = "Not sure enough to answer."
REJECT = {"method": "msp", "threshold": -1.0}  # every answer has msp >= 0: rejected
ACCEPT = {"threshold": 1e9}


@pytest.fixture(scope="module")
def withholding(service_settings: Settings) -> Settings:
    return service_settings.model_copy(update={"reject_action": RejectAction.WITHHOLD, "withheld_message": MESSAGE})


@pytest.fixture(scope="module")
def native(withholding: Settings) -> Iterator[TestClient]:
    with make_client(withholding) as client:
        yield client


@pytest.fixture(scope="module")
def official(withholding: Settings) -> Iterator[openai.OpenAI]:
    with live_server(withholding.model_copy(update={"api_key": None})) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def generate(client: TestClient, policy: dict, **extra: object) -> dict:
    response = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 6, "policy": policy, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_rejected_answer_is_replaced_by_the_message(native: TestClient) -> None:
    flagged = generate(native, {**REJECT, "action": "flag"}, top_logprobs=2)
    withheld = generate(native, REJECT, top_logprobs=2)
    assert not flagged["decision"]["withheld"] and flagged["text"] != MESSAGE and flagged["tokens"]
    assert withheld["decision"] == {**flagged["decision"], "withheld": True}
    assert withheld["text"] == MESSAGE and withheld["tokens"] is None
    assert (
        flagged["text"]
        not in native.post(  # not anywhere in the body, nor any of its tokens
            "/v1/generate", json={"messages": CHAT, "max_new_tokens": 6, "policy": REJECT, "top_logprobs": 2}
        ).text
    )
    # What was generated and how sure the model was are still reported, only the answer is not.
    assert withheld["uncertainty"] == flagged["uncertainty"] and withheld["usage"] == flagged["usage"]
    accepted = generate(native, ACCEPT)
    assert accepted["decision"]["accept"] and not accepted["decision"]["withheld"]
    assert accepted["text"] == flagged["text"] and len(accepted["tokens"]) == len(flagged["tokens"])


def test_a_withheld_stream_sends_no_token_and_an_accepted_one_every_token(native: TestClient) -> None:
    request = {"messages": CHAT, "max_new_tokens": 6, "stream": True}
    withheld = read_events(native, {**request, "policy": REJECT})
    assert [name for name, _ in withheld] == ["final"]
    flagged = generate(native, {**REJECT, "action": "flag"})["text"]
    assert flagged not in json.dumps(withheld)
    assert withheld[0][1]["text"] == MESSAGE and withheld[0][1]["decision"]["withheld"]
    accepted = read_events(native, {**request, "policy": ACCEPT})
    tokens = [data for name, data in accepted if name == "token"]
    final = accepted[-1][1]
    assert accepted[-1][0] == "final" and not final["decision"]["withheld"]
    assert len(tokens) == len(final["tokens"]) and "".join(t["text"] for t in tokens) == final["text"]


def test_early_stop_withholds_the_cut_answer(native: TestClient) -> None:
    request = {"messages": long_chat(native, 30), "max_new_tokens": 30, "early_stop": True}
    body = native.post("/v1/generate", json={**request, "policy": {"method": "msp", "threshold": 0.5}}).json()
    assert body["finish_reason"] == "uncertainty" and body["usage"]["completion_tokens"] < 30
    assert body["decision"]["withheld"] and body["text"] == MESSAGE


def test_a_scored_answer_is_never_withheld(native: TestClient) -> None:
    body = native.post("/v1/score", json={"messages": CHAT, "response": "paris .", "policy": REJECT}).json()
    assert not body["decision"]["accept"] and not body["decision"]["withheld"] and body["tokens"]


def test_info_and_metrics_show_the_action(native: TestClient) -> None:
    assert native.get("/info").json()["policy"]["action"] == "withhold"

    def withheld_count() -> float:
        for line in native.get("/metrics").text.splitlines():
            if line.startswith("tad_withheld_answers_total "):
                return float(line.split()[1])
        raise AssertionError("no tad_withheld_answers_total")

    before = withheld_count()
    generate(native, REJECT)
    generate(native, {**REJECT, "action": "flag"})
    assert withheld_count() == before + 1


def test_the_action_is_validated(native: TestClient) -> None:
    response = native.post("/v1/generate", json={"messages": CHAT, "policy": {"action": "hide"}})
    assert response.status_code == 422 and response.json()["error"]["param"] == "policy.action"


def test_the_official_client_gets_the_message_with_content_filter(official: openai.OpenAI) -> None:
    request = {"model": "model", "messages": CHAT, "max_tokens": 6, "logprobs": True}
    completion = official.chat.completions.create(**request, extra_body={"tad": {"policy": REJECT}})
    choice = completion.choices[0]
    assert choice.message.content == MESSAGE and choice.finish_reason == "content_filter"
    assert choice.logprobs is not None and choice.logprobs.content is None
    assert completion.model_extra["uncertainty"]["decision"]["withheld"]
    text = official.completions.create(
        model="model", prompt="the", max_tokens=4, logprobs=1, extra_body={"tad": {"policy": REJECT}}
    )
    assert text.choices[0].text == MESSAGE and text.choices[0].finish_reason == "content_filter"
    assert text.choices[0].logprobs is None
    accepted = official.chat.completions.create(**request, extra_body={"tad": {"policy": ACCEPT}})
    assert accepted.choices[0].finish_reason in ("stop", "length") and accepted.choices[0].logprobs.content


@pytest.mark.parametrize("chat", [True, False])
def test_the_official_client_streams_only_the_message(official: openai.OpenAI, chat: bool) -> None:
    policy = {"tad": {"policy": REJECT}, "logprobs": True if chat else 2}
    if chat:
        chunks = list(
            official.chat.completions.create(model="model", messages=CHAT, max_tokens=6, stream=True, extra_body=policy)
        )
        texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    else:
        chunks = list(
            official.completions.create(model="model", prompt="the", max_tokens=6, stream=True, extra_body=policy)
        )
        texts = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert texts == [MESSAGE]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "content_filter"
    assert chunks[-1].model_extra["uncertainty"]["text"] == MESSAGE
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices)


def test_an_accepted_answer_streams_whole_to_the_official_client(official: openai.OpenAI) -> None:
    """Held until the decision, then the same chunks as without withholding (text offsets included)."""
    request = {"model": "model", "prompt": "the capital", "max_tokens": 6, "temperature": 0, "logprobs": 0}

    def streamed(action: str) -> list:
        policy = {"tad": {"policy": {**ACCEPT, "action": action}}}
        chunks = list(official.completions.create(**request, stream=True, extra_body=policy))
        return [(c.choices[0].text, c.choices[0].logprobs, c.choices[0].finish_reason) for c in chunks if c.choices]

    held, flagged = streamed("withhold"), streamed("flag")
    assert held == flagged and len(held) == 7  # six tokens, then the finish
    assert "".join(text for text, _, _ in held) == official.completions.create(**request).choices[0].text


@pytest.fixture(scope="module")
def binding(withholding: Settings) -> Iterator[TestClient]:
    """Every answer rejected (msp >= 0 > -1), withheld, and no request may say otherwise."""
    with make_client(
        withholding, policy_overrides=False, reject_method="msp", reject_threshold=-1.0, reject_target=None
    ) as client:
        yield client


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/v1/generate", {"messages": CHAT, "policy": {"action": "flag"}}, "policy"),
        ("/v1/generate", {"messages": CHAT, "policy": {"threshold": 1e9}}, "policy"),
        ("/v1/score", {"messages": CHAT, "response": "paris .", "policy": {}}, "policy"),
        ("/v1/chat/completions", {"model": "model", "messages": CHAT, "tad": {"policy": {}}}, "tad.policy"),
    ],
)
def test_a_binding_policy_refuses_every_override(binding: TestClient, route: str, body: dict, param: str) -> None:
    response = binding.post(route, json=body)
    assert response.status_code == invalid_status(route) and response.json()["error"]["param"] == param
    assert "binding" in response.json()["error"]["message"]


def test_a_binding_policy_withholds_and_says_so(binding: TestClient) -> None:
    body = binding.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 4, "policy": None}).json()
    assert body["text"] == MESSAGE and body["decision"]["withheld"] and body["decision"]["policy"] == "fixed"
    chat = binding.post("/v1/chat/completions", json={"model": "model", "messages": CHAT, "max_tokens": 4}).json()
    assert chat["choices"][0]["message"]["content"] == MESSAGE
    policy = binding.get("/info").json()["policy"]
    assert policy["action"] == "withhold" and policy["overridable"] is False
    schema = binding.get("/openapi.json").json()["components"]["schemas"]
    for request in ("GenerateRequest", "ScoreRequest", "TadOptions"):
        assert schema[request]["properties"]["policy"]["type"] == "null"
