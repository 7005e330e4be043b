"""The OpenAI-compatible routes, exercised with the official `openai` client over a real socket."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from app.api.common import MAX_TEXT_CHARS
from app.api.openai.protocol import OpenAIMessage
from app.api.openai.routes import chat_message
from app.settings import Settings
from app.uncertainty.methods import METHODS
from tests.app.live_server import live_server

MESSAGES = [{"role": "user", "content": "what is the capital of france ?"}]


@pytest.fixture(scope="module")
def client(service_settings: Settings) -> Iterator[openai.OpenAI]:
    with live_server(service_settings.model_copy(update={"api_key": None})) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["model"]
    assert client.models.retrieve("model").id == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


def test_the_model_spec_the_server_was_started_with_names_its_model_too(
    client: openai.OpenAI, service_settings: Settings
) -> None:
    # `TAD_MODEL=qwen2.5-coder-1.5b` serves "qwen2.5-coder-1.5b-instruct-q4_k_m"; a client that sends the
    # name it started the server with is asking for that model (here the spec is the tiny model's folder).
    reply = client.chat.completions.create(model=service_settings.model, messages=MESSAGES, max_tokens=2)
    assert reply.model == "model"


def test_null_means_not_set_as_in_the_openai_api(client: openai.OpenAI) -> None:
    nulls = {"n": None, "stream": None, "logprobs": None, "presence_penalty": None, "frequency_penalty": None}
    completion = client.chat.completions.create(model="model", messages=MESSAGES, max_tokens=3, extra_body=nulls)
    assert completion.choices[0].logprobs is None and completion.usage.completion_tokens >= 1
    text_nulls = {**nulls, "logprobs": None, "echo": None}
    text = client.completions.create(model="model", prompt="a", max_tokens=3, extra_body=text_nulls)
    assert text.choices[0].logprobs is None


def test_chat_completion_with_logprobs_and_uncertainty(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="model", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    choice = completion.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    content = choice.logprobs.content
    # The stop token that ended an answer is generated, counted in usage, and not among its tokens.
    assert len(content) + (choice.finish_reason == "stop") == completion.usage.completion_tokens > 0
    for item in content:
        assert len(item.top_logprobs) == 3 and item.top_logprobs[0].logprob >= item.logprob - 1e-6
    assert "".join(t.token for t in content).replace(" ", "") == choice.message.content.replace(" ", "")
    extension = completion.model_extra["uncertainty"]
    assert set(extension["sequence"]) == {method.name for method in METHODS}  # every registered method
    assert len(extension["tokens"]) == len(content) and extension["decision"]["method"] == "tad"


def test_chat_completion_stream(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="model",
        messages=MESSAGES,
        max_tokens=7,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    closing = finals[0].model_extra["uncertainty"]
    assert closing["decision"]["method"] == "tad" and closing["text"].replace(" ", "") == text.replace(" ", "")
    confidences = [
        c.model_extra["uncertainty"]["token"]["confidence"] for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(confidences) + (finals[0].choices[0].finish_reason == "stop") == chunks[-1].usage.completion_tokens
    # With include_usage every other chunk has the field too, null, as OpenAI sends them.
    assert all("usage" in c.model_fields_set and c.usage is None for c in chunks[:-1])
    whole = client.chat.completions.create(model="model", messages=MESSAGES, max_tokens=7, temperature=0)
    assert whole.choices[0].message.content == closing["text"]
    assert [t["confidence"] for t in whole.model_extra["uncertainty"]["tokens"]] == pytest.approx(confidences)


def test_text_completion(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model="model", prompt="the capital of", max_tokens=5, temperature=0, logprobs=2
    )
    choice = completion.choices[0]
    assert len(choice.logprobs.tokens) == 5 == completion.usage.completion_tokens
    assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs)
    assert completion.model_extra["uncertainty"]["sequence"]["msp"] > 0
    streamed = list(
        client.completions.create(
            model="model", prompt="the capital of", max_tokens=5, temperature=0, stream=True, logprobs=2
        )
    )
    assert "".join(c.choices[0].text for c in streamed).strip() != ""
    streamed_logprobs = [c.choices[0].logprobs for c in streamed if c.choices[0].logprobs is not None]
    # Each token's chunk carries its alternatives, as the whole response does.
    assert len(streamed_logprobs) == len(choice.logprobs.top_logprobs)
    for streamed_top, whole_top in zip(streamed_logprobs, choice.logprobs.top_logprobs, strict=True):
        assert streamed_top.top_logprobs[0] == pytest.approx(whole_top)
    assert [lp.tokens[0] for lp in streamed_logprobs] == choice.logprobs.tokens
    # Offsets count as the stream sends the text: the tiny model's word-level decoder adds the spaces between
    # tokens that no token's bytes hold (so counting bytes put them inside the next word).
    assert [lp.text_offset[0] for lp in streamed_logprobs] == choice.logprobs.text_offset
    assert "".join(c.choices[0].text for c in streamed) == choice.text


def test_usage_counts_the_tokens_a_stop_string_ended_on(client: openai.OpenAI) -> None:
    """Generated and billed, as vLLM counts them, though the stop string trims them from the answer: the text
    up to and through a three-word stop took nine tokens (this tokenizer's tokens are words)."""
    free = client.completions.create(model="model", prompt="the capital of", max_tokens=12, temperature=0)
    words = free.choices[0].text.split()
    assert len(words) == free.usage.completion_tokens == 12
    request = {
        "model": "model",
        "prompt": "the capital of",
        "max_tokens": 12,
        "temperature": 0,
        "stop": [" ".join(words[6:9])],
    }
    stopped = client.completions.create(**request)
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].text.split() == words[:6]
    streamed = list(client.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    assert stopped.usage.completion_tokens == streamed[-1].usage.completion_tokens == 9


def test_a_sampled_completion_token_is_always_among_its_top_logprobs(client: openai.OpenAI) -> None:
    """OpenAI's legacy completions return the sampled token's logprob with the `logprobs` most likely ones
    (up to `logprobs` + 1 entries); at a high temperature it is often not among them."""
    for stream in (False, True):
        outside = 0
        for seed in range(4):
            request = dict(model="model", prompt="the capital of", max_tokens=10, temperature=2.0, logprobs=1)
            if stream:
                chunks = list(client.completions.create(**request, seed=seed, stream=True))
                logprobs = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs is not None]
                pairs = [(lp.tokens[0], lp.top_logprobs[0], lp.token_logprobs[0]) for lp in logprobs]
            else:
                lp = client.completions.create(**request, seed=seed).choices[0].logprobs
                pairs = list(zip(lp.tokens, lp.top_logprobs, lp.token_logprobs, strict=True))
            for token, top, logprob in pairs:
                assert top[token] == pytest.approx(logprob) and len(top) <= 2
                outside += len(top) == 2
        assert outside > 0, "no sampled token fell outside the top 1: the case is not exercised"


def test_completion_logprobs_0_gives_each_sampled_token_alone(client: openai.OpenAI) -> None:
    """`logprobs: 0` asks for no alternatives, and OpenAI still returns the sampled token's logprob (vLLM too)."""
    request = dict(model="model", prompt="the capital of", max_tokens=4, temperature=0, logprobs=0)
    whole = client.completions.create(**request).choices[0].logprobs
    streamed = [c.choices[0].logprobs for c in client.completions.create(**request, stream=True) if c.choices]
    streamed = [lp for lp in streamed if lp is not None]
    assert [top for lp in streamed for top in lp.top_logprobs] == whole.top_logprobs
    for token, top, logprob in zip(whole.tokens, whole.top_logprobs, whole.token_logprobs, strict=True):
        assert top == {token: pytest.approx(logprob)}


def test_early_stop_cuts_the_answer_and_says_so_in_the_extension(client: openai.OpenAI) -> None:
    """`tad.early_stop` on the OpenAI routes: cut at the threshold (MSP only grows), `finish_reason` `stop` (OpenAI
    has no value for it), and the extension's own `uncertainty`, rejected; streamed, the same."""
    tad = {"early_stop": True, "policy": {"method": "msp", "threshold": 0.0}}
    request = {"model": "model", "messages": MESSAGES, "max_tokens": 30, "temperature": 0, "extra_body": {"tad": tad}}
    cut = client.chat.completions.create(**request)
    extension = cut.model_extra["uncertainty"]
    assert cut.choices[0].finish_reason == "stop" and extension["finish_reason"] == "uncertainty"
    assert not extension["decision"]["accept"] and 4 <= len(extension["tokens"]) < 30
    chunks = list(client.chat.completions.create(**request, stream=True))
    closing = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    assert (
        closing.choices[0].finish_reason == "stop"
        and closing.model_extra["uncertainty"]["finish_reason"] == "uncertainty"
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut.choices[0].message.content


def test_text_parts_of_a_message_are_joined_by_newlines_as_in_vllm(client: openai.OpenAI) -> None:
    parts = [{"type": "text", "text": "what is the capital"}, {"type": "text", "text": "of france ?"}]
    joined = [{"role": "user", "content": "what is the capital\nof france ?"}]
    as_parts = client.chat.completions.create(
        model="model", messages=[{"role": "user", "content": parts}], max_tokens=4, temperature=0
    )
    as_text = client.chat.completions.create(model="model", messages=joined, max_tokens=4, temperature=0)
    assert as_parts.usage.prompt_tokens == as_text.usage.prompt_tokens
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content


def test_a_participants_name_goes_to_the_chat_template_as_vllm_passes_it() -> None:
    named = OpenAIMessage(role="developer", content="be brief", name="ops")
    assert chat_message(named) == {"role": "system", "content": "be brief", "name": "ops"}
    assert chat_message(OpenAIMessage(role="user", content="hi")) == {"role": "user", "content": "hi"}


def test_seeded_sampling_reproduces(client: openai.OpenAI) -> None:
    kwargs = {"model": "model", "messages": MESSAGES, "max_tokens": 8, "temperature": 1.0, "seed": 3}
    first = client.chat.completions.create(**kwargs).choices[0].message.content
    assert client.chat.completions.create(**kwargs).choices[0].message.content == first
    # Negative seeds, as OpenAI's API takes them, down to -2**53 (exact as a JSON number in any client).
    for seed in (-1, -(2**53), 2**53):
        again = [client.chat.completions.create(**{**kwargs, "seed": seed}).choices[0].message.content for _ in "ab"]
        assert again[0] == again[1]
    for seed in (2**53 + 1, -(2**63)):
        with pytest.raises(openai.BadRequestError) as too_big:
            client.chat.completions.create(**{**kwargs, "seed": seed})
        assert too_big.value.body["param"] == "seed"


def test_errors_map_to_openai_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-9", messages=MESSAGES)
    assert missing.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as choices:
        client.chat.completions.create(model="model", messages=MESSAGES, n=2)
    assert choices.value.body["param"] == "n" and "only one choice" in choices.value.body["message"]
    with pytest.raises(openai.BadRequestError) as penalty:
        client.chat.completions.create(model="model", messages=MESSAGES, presence_penalty=0.5)
    assert penalty.value.body["param"] == "presence_penalty" and "not supported" in penalty.value.body["message"]
    # OpenAI's options this service does not take are called unsupported, not unknown.
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    with pytest.raises(openai.BadRequestError) as tools:
        client.chat.completions.create(model="model", messages=MESSAGES, tools=[tool])  # type: ignore[list-item]
    assert tools.value.body["message"] == "tools: not supported by this service"
    with pytest.raises(openai.BadRequestError) as ids:
        client.completions.create(model="model", prompt=[1, 2, 3])
    assert "token ids are not supported" in ids.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="model", messages=MESSAGES, max_tokens=10_000)
    with pytest.raises(openai.BadRequestError) as too_many:
        client.chat.completions.create(model="model", messages=MESSAGES, max_completion_tokens=10_000)
    assert too_many.value.body["param"] == "max_completion_tokens"
    with pytest.raises(openai.BadRequestError) as target:
        client.chat.completions.create(
            model="model", messages=MESSAGES, extra_body={"tad": {"policy": {"target": "error@0.01"}}}
        )
    assert target.value.body["param"] == "tad.policy.target"
    with pytest.raises(openai.BadRequestError) as unthresholded:  # the message names the fields as sent here
        client.chat.completions.create(
            model="model", messages=MESSAGES, extra_body={"tad": {"policy": {"method": "p_true"}}}
        )
    message = unthresholded.value.body["message"]
    assert "send tad.policy.threshold" in message and " policy.threshold" not in message
    # Checks across fields still name the field the client must change.
    with pytest.raises(openai.BadRequestError) as needs_logprobs:
        client.chat.completions.create(model="model", messages=MESSAGES, top_logprobs=3)
    assert needs_logprobs.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as no_text:
        client.chat.completions.create(
            model="model", messages=[{"role": "user", "content": [{"type": "text", "text": " "}]}]
        )
    assert no_text.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as not_streaming:
        client.chat.completions.create(model="model", messages=MESSAGES, stream_options={"include_usage": True})
    assert not_streaming.value.body["param"] == "stream_options"


def test_a_previous_answer_sent_back_as_dumped_and_harmless_options_are_served(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="model", messages=MESSAGES, max_tokens=3, temperature=0)
    replayed = first.choices[0].message.model_dump()  # refusal, tool_calls, audio ... all null
    assert "refusal" in replayed and "tool_calls" in replayed
    follow_up = client.chat.completions.create(
        model="model",
        messages=[*MESSAGES, replayed, {"role": "user", "content": "and of spain ?"}],
        max_tokens=3,
        response_format={"type": "text"},
        tool_choice="none",
        parallel_tool_calls=False,
        store=False,
        metadata={"team": "search"},
        # What frameworks fill in: hints, identifiers, and the defaults of features this service lacks.
        prompt_cache_key="team-search",
        safety_identifier="user-1",
        modalities=["text"],
        extra_body={"function_call": "none", "audio": None, "prediction": None},
    )
    assert follow_up.choices[0].message.content is not None


@pytest.mark.parametrize(
    ("route", "options", "param", "only"),
    [
        ("chat", {"verbosity": "low"}, "verbosity", ""),
        ("chat", {"audio": {"voice": "alloy", "format": "wav"}}, "audio", ""),
        ("chat", {"prediction": {"type": "content", "content": "x"}}, "prediction", ""),
        ("chat", {"function_call": "auto"}, "function_call", " (only 'none')"),
        ("chat", {"tool_choice": "required"}, "tool_choice", " (only 'none')"),
        ("chat", {"modalities": ["audio"]}, "modalities.0", " (only 'text')"),
        ("chat", {"response_format": {"type": "json_object"}}, "response_format.type", " (only 'text')"),
        ("text", {"suffix": "the end"}, "suffix", ""),
    ],
)
def test_openai_options_this_service_lacks_are_refused_as_unsupported_not_unknown(
    client: openai.OpenAI, route: str, options: dict, param: str, only: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        if route == "chat":
            client.chat.completions.create(model="model", messages=MESSAGES, max_tokens=3, extra_body=options)
        else:
            client.completions.create(model="model", prompt="the", max_tokens=3, extra_body=options)
    assert refused.value.body["param"] == param
    assert refused.value.body["message"] == f"{param}: not supported by this service{only}"


def test_a_message_too_long_is_counted_in_characters(client: openai.OpenAI) -> None:
    long = "a" * (MAX_TEXT_CHARS + 1)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="model", messages=[{"role": "user", "content": long}], max_tokens=3)
    assert refused.value.body["message"] == (
        f"messages.0.content: Text should have at most {MAX_TEXT_CHARS} characters, not {MAX_TEXT_CHARS + 1}"
    )


@pytest.mark.parametrize(
    ("options", "param"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format.type"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"store": True}, "store"),
        ({"store": 0.0}, "store"),  # equal to false, but not a boolean (schemathesis found it accepted)
        ({"store": 0}, "store"),
    ],
)
def test_options_that_would_change_the_answer_are_refused(client: openai.OpenAI, options: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="model", messages=MESSAGES, max_tokens=3, **options)
    assert refused.value.body["param"] == param
