"""P(True): a policy deciding with it runs one more pass over the question and the answer; nothing else does."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.serving.check_pass import CHECK_PROMPT, YES
from app.settings import Settings
from app.uncertainty.artifact import load_artifact
from app.uncertainty.methods import BASELINES, REGISTRY, Method
from tests.app.api.native.test_streaming import read_events
from tests.app.service_client import CHAT, invalid_status, make_client

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


def test_a_given_answer_is_decided_with_p_true_as_the_same_generated_answer_is(client: TestClient) -> None:
    generated = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 6, "policy": P_TRUE_POLICY})
    answer = generated.json()
    assert answer["text"].strip()
    scored = client.post("/v1/score", json={"messages": CHAT, "response": answer["text"], "policy": P_TRUE_POLICY})
    assert scored.status_code == 200
    decision, p_true = scored.json()["decision"], scored.json()["uncertainty"]["p_true"]
    assert p_true == pytest.approx(answer["uncertainty"]["p_true"], abs=1e-5)
    assert decision["method"] == "p_true" and decision["score"] == pytest.approx(p_true)
    assert decision["accept"] is answer["decision"]["accept"]


@pytest.fixture(scope="module")
def long_client(service_settings: Settings) -> Iterator[TestClient]:
    """Prompts and answers up to the tiny model's whole context of 2,048 tokens."""
    with make_client(service_settings, max_prompt_tokens=2048, max_new_tokens_limit=512) as client:
        yield client


def _near_the_context(client: TestClient, room: int) -> tuple[list[dict[str, str]], int]:
    """A chat prompt that leaves about `room` tokens of the tiny model's 2,048, and its length."""
    messages = [{"role": "user", "content": "x " * (2048 - room)}]
    usage = client.post("/v1/generate", json={"messages": messages, "max_new_tokens": 1}).json()["usage"]
    return messages, usage["prompt_tokens"]


def test_an_answer_whose_check_prompt_would_not_fit_is_refused_before_it_is_generated(
    long_client: TestClient,
) -> None:
    client = long_client
    messages, prompt_tokens = _near_the_context(client, room=80)
    fits = 2048 - prompt_tokens  # prompt and answer fill the context; the check prompt holds both and more
    assert 0 < fits < 512
    plain = {"messages": messages, "max_new_tokens": fits}
    assert client.post("/v1/generate", json={**plain, "policy": {"method": "msp", "threshold": 1.0}}).status_code == 200
    refused = client.post("/v1/generate", json={**plain, "policy": P_TRUE_POLICY})
    error = refused.json()["error"]
    assert refused.status_code == 422 and error["param"] == "max_new_tokens"
    assert "asks the model about its answer" in error["message"]


def test_a_given_answer_whose_check_prompt_would_not_fit_is_refused(long_client: TestClient) -> None:
    client = long_client
    messages, prompt_tokens = _near_the_context(client, room=80)
    response = "y " * (2048 - prompt_tokens - 10)
    body = {"messages": messages, "response": response}
    assert client.post("/v1/score", json=body).status_code == 200
    refused = client.post("/v1/score", json={**body, "policy": P_TRUE_POLICY})
    error = refused.json()["error"]
    assert refused.status_code == 422 and error["param"] == "response"
    assert "with this response, has" in error["message"] and "(0)" not in error["message"]


def test_without_a_length_asked_for_the_default_gives_way_to_the_check_prompt(long_client: TestClient) -> None:
    """A field the client never sent is not to blame: the default shrinks to what the check prompt leaves."""
    client = long_client
    messages, prompt_tokens = _near_the_context(client, room=40)
    body = client.post("/v1/generate", json={"messages": messages, "policy": P_TRUE_POLICY}).json()
    assert 0 < body["usage"]["completion_tokens"] < 2048 - prompt_tokens
    assert body["uncertainty"]["p_true"] is not None


@pytest.mark.parametrize("route", ["/v1/generate", "/v1/score"])
def test_a_question_whose_check_prompt_leaves_no_room_is_refused_naming_the_prompt(
    long_client: TestClient, route: str
) -> None:
    client = long_client
    messages, _ = _near_the_context(client, room=8)  # the check prompt's own words take more than that
    body = {"messages": messages, "policy": P_TRUE_POLICY}
    refused = client.post(route, json={**body, "response": "Paris."} if route == "/v1/score" else body)
    error = refused.json()["error"]
    assert refused.status_code == 422 and error["param"] == "messages", error
    assert "leaves no room for an answer" in error["message"] and "shorten the prompt" in error["message"]


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("/v1/generate", {"messages": CHAT, "early_stop": True, "policy": P_TRUE_POLICY}, "early_stop"),
        (
            "/v1/chat/completions",
            {"model": "model", "messages": CHAT, "tad": {"early_stop": True, "policy": P_TRUE_POLICY}},
            "tad.early_stop",
        ),
    ],
)
def test_early_stop_with_p_true_is_refused_as_it_could_never_stop(
    client: TestClient, route: str, body: dict, param: str
) -> None:
    response = client.post(route, json={**body, "max_tokens" if "tad" in body else "max_new_tokens": 4})
    assert response.status_code == invalid_status(route) and response.json()["error"]["param"] == param


def test_a_stream_waiting_for_its_check_pass_keeps_its_connection_alive(
    service_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from app.engine.teacher_forcing import ScoringPass

    advance = ScoringPass.advance

    def slow_advance(self: ScoringPass, max_tokens: int | None = None) -> object:
        time.sleep(0.4)  # the check pass queued behind long work
        return advance(self, max_tokens)

    monkeypatch.setattr(ScoringPass, "advance", slow_advance)
    with make_client(service_settings, stream_keepalive_s=0.05) as client:
        request = {"messages": CHAT, "max_new_tokens": 4, "stream": True, "policy": P_TRUE_POLICY}
        with client.stream("POST", "/v1/generate", json=request) as response:
            lines = [line for line in response.iter_lines() if line]
    last_token = max(i for i, line in enumerate(lines) if line == "event: token")
    final = lines.index("event: final")
    # one as the pass starts (what the consumer holds goes out), then more while it runs
    assert lines[last_token:final].count(": keep-alive") >= 3


def test_an_answer_whose_check_prompt_outgrows_the_context_is_kept_unscored_and_rejected(
    service_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Room for the check prompt is reserved before generating; an answer that re-tokenizes longer in it must
    not be thrown away with an error after it was computed."""
    from app.serving import service as service_module

    real_check_pass = service_module.check_pass

    def longer(engine, question, answer):  # type: ignore[no-untyped-def]
        ids, yes = real_check_pass(engine, question, answer)
        return ids + (ids[-1],) * 2048, yes  # past the tiny model's context of 2,048

    monkeypatch.setattr(service_module, "check_pass", longer)
    with make_client(service_settings) as client:
        response = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 6, "policy": P_TRUE_POLICY})
    assert response.status_code == 200
    body = response.json()
    assert body["text"] and body["uncertainty"]["p_true"] is None
    assert body["decision"]["method"] == "p_true" and body["decision"]["score"] is None
    assert body["decision"]["accept"] is False
