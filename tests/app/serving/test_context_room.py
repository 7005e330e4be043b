"""What fits in the model's context: the prompt and its answer, and P(True)'s check prompt with them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from app.engine.engine import Engine
from app.errors import InvalidRequest
from app.serving import context_room
from app.serving.context_room import check_context, fit_check_pass
from app.settings import Settings
from tests.app.service_client import make_client


def _engine(context: int, refusal: str | None, slot_length: int) -> Engine:
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=context))
    fake = SimpleNamespace(
        loaded=SimpleNamespace(model=model), compiled_decode_refusal=lambda: refusal, compiled_decode_length=slot_length
    )
    return fake  # type: ignore[return-value]


def test_a_compiled_steps_slot_shorter_than_the_context_caps_prompt_plus_answer() -> None:
    compiled = _engine(context=2048, refusal=None, slot_length=64)
    check_context(compiled, 40, 23, "max_tokens")  # 63 tokens: the slot's 64 less the last token's own step
    with pytest.raises(InvalidRequest, match="maximum context length of 63 tokens") as refused:
        check_context(compiled, 40, 24, "max_tokens")
    assert refused.value.param == "max_tokens"
    # A prompt that fills the slot alone: no answer length fits, so the prompt is named.
    with pytest.raises(InvalidRequest, match=r"the prompt \(63 tokens\) leaves no room") as refused:
        check_context(compiled, 63, 1, "max_tokens", prompt_field="messages")
    assert refused.value.param == "messages"
    eager = _engine(context=2048, refusal="compiled decoding is off", slot_length=64)
    check_context(eager, 40, 2008, "max_tokens")
    with pytest.raises(InvalidRequest, match="maximum context length of 2048 tokens"):
        check_context(eager, 40, 2009, "max_tokens")


@pytest.mark.parametrize(
    ("answer_tokens", "asked", "fitted"),
    [(10, True, 10), (27, True, 27), (27, False, 27), (28, False, 27), (500, False, 27)],
)
def test_the_check_prompt_leaves_its_room_to_the_answer(
    answer_tokens: int, asked: bool, fitted: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A check prompt of 36 tokens and the one token it scores, in a context of 64: 27 tokens of answer fit.
    monkeypatch.setattr(context_room, "check_pass", lambda engine, question, answer: (tuple(range(36)), (1,)))
    engine = _engine(context=64, refusal="eager", slot_length=0)
    assert asyncio.run(fit_check_pass(engine, "question", "messages", answer_tokens, "max_tokens", asked)) == fitted


def test_an_answer_asked_for_that_the_check_prompt_leaves_no_room_for_names_its_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(context_room, "check_pass", lambda engine, question, answer: (tuple(range(36)), (1,)))
    engine = _engine(context=64, refusal="eager", slot_length=0)
    with pytest.raises(InvalidRequest, match="at most 27 tokens of answer fit") as refused:
        asyncio.run(fit_check_pass(engine, "question", "messages", 28, "max_tokens", asked=True))
    assert refused.value.param == "max_tokens"
    monkeypatch.setattr(context_room, "check_pass", lambda engine, question, answer: (tuple(range(63)), (1,)))
    with pytest.raises(InvalidRequest, match="leaves no room for an answer") as refused:
        asyncio.run(fit_check_pass(engine, "question", "messages", 1, "max_tokens", asked=False))
    assert refused.value.param == "messages"  # the question's fault, whatever length was asked for


def test_a_prompt_longer_than_the_context_is_named_whatever_answer_length_is_sent(service_settings: Settings) -> None:
    # The tiny model's context is 2,048 tokens; the prompt limit is set above it, so the context refuses.
    messages = [{"role": "user", "content": "x " * 2100}]
    with make_client(service_settings, max_prompt_tokens=4096) as client:
        requests = [
            ("/v1/generate", {"messages": messages, "max_new_tokens": 1}),
            ("/v1/score", {"messages": messages, "response": "Paris"}),
            ("/v1/chat/completions", {"model": "any", "messages": messages, "max_tokens": 1}),
        ]
        for path, body in requests:
            if path.startswith("/v1/chat"):
                body["model"] = client.get("/v1/models").json()["data"][0]["id"]
            refused = client.post(path, json=body)
            assert 400 <= refused.status_code < 500, path
            error = refused.json()["error"]
            assert error["param"] == "messages" and "leaves no room for an answer" in error["message"], path
