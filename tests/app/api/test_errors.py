"""Every error path through the HTTP layer: one body shape, the right status, the field named."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from fastapi.testclient import TestClient

from app.api.common import MAX_TEXT_CHARS
from app.serving.runtime import Runtime
from app.settings import Settings
from tests.app.service_client import CHAT, invalid_status, make_client


def assert_error(response, status: int, param: str | None = None, error_type: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status and body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param, body
    if error_type is not None:
        assert body["error"]["type"] == error_type
    return body["error"]


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({}, "messages"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "   "}, "prompt"),
        ({"prompt": "a", "messages": CHAT}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": " "}]}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        ({"prompt": "a", "max_new_tokens": 0}, "max_new_tokens"),
        ({"prompt": "a", "max_new_tokens": 33}, "max_new_tokens"),
        ({"prompt": "a", "max_new_tokens": "many"}, "max_new_tokens"),
        ({"prompt": "a", "temperature": -1}, "temperature"),
        ({"prompt": "a", "top_p": 0}, "top_p"),
        ({"prompt": "a", "seed": -5}, "seed"),
        ({"prompt": "a", "stop": [""]}, "stop"),
        ({"prompt": "a", "stop": ["x"] * 9}, "stop"),
        ({"prompt": "a", "stop": [1]}, "stop"),  # not pydantic's label of the union member ("stop.constrained-str")
        ({"prompt": "a", "stop": 1}, "stop"),
        ({"prompt": "a", "unknown_field": 1}, "unknown_field"),
        ({"prompt": "a", "policy": {"threshold": 1, "target": "error@0.3"}}, "policy"),
        ({"prompt": "a", "policy": {"method": "oracle"}}, "policy.method"),
        ({"prompt": "the " * 250}, "prompt"),
        ({"prompt": "a", "policy": {"target": "error@" + "9" * 100}}, "policy.target"),
    ],
)
def test_generate_rejects_bad_input_naming_the_field(client: TestClient, payload: dict, param: str) -> None:
    assert_error(client.post("/v1/generate", json=payload), 422, param, "invalid_request_error")


LONG_TEXT = "x" * (MAX_TEXT_CHARS + 1)


@pytest.mark.parametrize(
    ("route", "payload", "param"),
    [
        ("/v1/generate", {"prompt": LONG_TEXT}, "prompt"),
        ("/v1/generate", {"messages": [{"role": "user", "content": LONG_TEXT}]}, "messages.0.content"),
        ("/v1/score", {"prompt": "a", "response": LONG_TEXT}, "response"),
        ("/v1/completions", {"model": "model", "prompt": LONG_TEXT}, "prompt"),
        # A list of one prompt was held to 200,000 items, not characters (schemathesis's coverage phase found it).
        ("/v1/completions", {"model": "model", "prompt": [LONG_TEXT]}, "prompt"),
        (
            "/v1/chat/completions",
            {"model": "model", "messages": [{"role": "user", "content": LONG_TEXT}]},
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            {"model": "model", "messages": [{"role": "user", "content": [{"type": "text", "text": LONG_TEXT}]}]},
            "messages.0.content",
        ),
    ],
)
def test_text_over_the_length_limit_is_refused_naming_the_field(
    client: TestClient, route: str, payload: dict, param: str
) -> None:
    assert_error(client.post(route, json=payload), invalid_status(route), param, "invalid_request_error")


def test_malformed_json_and_wrong_content(client: TestClient) -> None:
    bad_json = client.post("/v1/generate", content=b'{"prompt": ', headers={"content-type": "application/json"})
    error = assert_error(bad_json, 422, "body")
    assert error["message"].startswith("body: JSON decode error at character")
    assert_error(client.post("/v1/generate", json=["prompt"]), 422)
    # JSON sent without saying so (curl -d sends a form): the message says what to send.
    sent_types = (("text/plain", "text/plain"), ("application/jsonx", "application/jsonx"), ("text/json", "text/json"))
    for headers, sent in (*(({"content-type": header}, sent) for header, sent in sent_types), ({}, "none")):
        unsaid = client.post("/v1/generate", content=b'{"prompt": "a"}', headers=headers)
        error = assert_error(unsaid, 422, "body")
        assert (
            error["message"]
            == f"body: send a JSON object with the header content-type: application/json (this one: {sent})"
        )
    # A JSON array is JSON: it keeps pydantic's message.
    assert "content-type" not in assert_error(client.post("/v1/generate", json=["prompt"]), 422)["message"]
    problem_json = {"content-type": "application/problem+json; charset=utf-8"}  # read as JSON by FastAPI
    assert client.post("/v1/generate", content=b'{"prompt": "a", "max_new_tokens": 1}', headers=problem_json).is_success


def test_a_body_wrong_in_many_places_gets_a_short_answer(client: TestClient) -> None:
    """Every problem described, a body with 150,000 bad list items got a 6.6 MB answer built on the event loop."""
    error = assert_error(client.post("/v1/generate", json={"prompt": "a", "stop": [1] * 20_000}), 422, "stop")
    assert "List should have at most 256 items" in error["message"]  # refused whole, its items never validated
    error = assert_error(client.post("/v1/generate", json={"prompt": "a", "stop": [[1]] * 256}), 422, "stop")
    assert len(error["message"]) < 1000 and error["message"].endswith("more problems")
    # Lists and maps the OpenAI routes take one of, or none: refused whole, their items never validated.
    chat = {"model": "m", "messages": [{"role": "user", "content": "a"}]}
    for route, body, param, said in (
        ("/v1/completions", {"model": "m", "prompt": [1] * 20_000}, "prompt", "token ids are not supported"),
        ("/v1/chat/completions", {**chat, "logit_bias": {str(i): "x" for i in range(20_000)}}, "logit_bias", "not"),
        (
            "/v1/chat/completions",
            {**chat, "messages": [{"role": "user", "content": [{"type": "img"}] * 20_000}]},
            "messages.0.content",
            "at most 1024 items",
        ),
    ):
        error = assert_error(client.post(route, json=body), 400, param)
        assert said in error["message"] and "more problems" not in error["message"], error
    unknown = {"prompt": "a", **{f"field{i}": 1 for i in range(1000)}}
    error = assert_error(client.post("/v1/generate", json=unknown), 422, "field0")
    assert "and 995 more problems" in error["message"] and "field999" not in error["message"]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_a_body_the_openai_routes_cannot_read_is_a_400_as_openai_answers(client: TestClient, route: str) -> None:
    """OpenAI's clients raise a 400 as `BadRequestError`, what code written against OpenAI catches."""
    json_header = {"content-type": "application/json"}
    assert_error(client.post(route, content=b'{"model": ', headers=json_header), 400, "body", "invalid_request_error")
    assert_error(client.post(route, content=b'{"model": "m"}', headers={}), 400, "body")
    assert_error(client.post(route, content=b'{"model": "\xff"}', headers=json_header), 400, "body")


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"prompt": "a", "response": ""}, "response"),
        ({"prompt": "a"}, "response"),
        ({"response": "x"}, "messages"),
        ({"prompt": "a", "response": "x", "extra": True}, "extra"),
    ],
)
def test_score_rejects_bad_input(client: TestClient, payload: dict, param: str) -> None:
    assert_error(client.post("/v1/score", json=payload), 422, param)


def test_body_over_the_limit_is_413(service_settings: Settings) -> None:
    with make_client(service_settings, max_body_bytes=2000) as client:
        big = {"prompt": "x" * 5000}
        assert_error(client.post("/v1/generate", json=big), 413, error_type="payload_too_large")
        chunked = client.post(
            "/v1/generate",
            content=iter([b'{"prompt": "', b"y" * 3000, b'"}']),
            headers={"content-type": "application/json"},
        )
        assert_error(chunked, 413)
        assert client.post("/v1/generate", json={"prompt": "ok", "max_new_tokens": 1}).status_code == 200


def test_unknown_route_and_method(client: TestClient) -> None:
    assert_error(client.get("/v1/nothing"), 404)
    assert_error(client.get("/v1/generate"), 405)


def test_503_with_retry_after_until_ready(service_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    original = Runtime.load

    def slow_load(self: Runtime) -> None:
        release.wait(30)
        original(self)

    monkeypatch.setattr(Runtime, "load", slow_load)
    with make_client(service_settings, ready=False) as client:
        assert client.get("/health").json() == {"status": "ok"}
        for response in (client.get("/ready"), client.post("/v1/generate", json={"prompt": "a"}), client.get("/info")):
            assert_error(response, 503, error_type="not_ready")
            assert int(response.headers["retry-after"]) > 0
        release.set()
        deadline = time.monotonic() + 30
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 2}).status_code == 200


def test_a_sigterm_during_the_load_keeps_the_replica_out_of_rotation(
    service_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Runtime.load

    def drained_while_loading(self: Runtime) -> None:
        self.begin_draining()  # SIGTERM arrives while the model loads
        original(self)

    monkeypatch.setattr(Runtime, "load", drained_while_loading)
    with make_client(service_settings, ready=False) as client:
        runtime = client.app.state.runtime  # type: ignore[attr-defined]
        deadline = time.monotonic() + 30
        while runtime.load_seconds is None:  # the load goes on to its end
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.2)  # the few statements after it, where the gauge was set
        assert_error(client.get("/ready"), 503, error_type="not_ready")
        assert "tad_ready 0.0" in client.get("/metrics").text


def test_a_stopped_worker_takes_the_replica_out_of_rotation(service_settings: Settings) -> None:
    with make_client(service_settings) as client:
        client.app.state.runtime.scheduler.stop()  # type: ignore[attr-defined]  # as if its thread had died
        generate = client.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 2})
        for response in (client.get("/ready"), generate, client.get("/health")):  # /health: only a restart mends it
            error = assert_error(response, 503, error_type="not_ready")
            assert "worker has stopped" in error["message"]
        assert "tad_ready 0.0" in client.get("/metrics").text


def test_a_model_failing_every_step_takes_the_replica_out_and_asks_for_a_restart(
    service_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine.decoding import DecodeBatch

    def failing_step(self: DecodeBatch) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")  # what a poisoned context says

    with make_client(service_settings, broken_after_failed_steps=2) as client:
        assert client.get("/health").status_code == 200
        # A poisoned context fails every forward: the prefill as well as the decode steps.
        monkeypatch.setattr(DecodeBatch, "step", failing_step)
        monkeypatch.setattr(client.app.state.runtime.engine, "start_prefill", failing_step)  # type: ignore[attr-defined]
        body = {"prompt": "a", "max_new_tokens": 3}
        assert_error(client.post("/v1/generate", json=body), 500)
        assert client.get("/ready").status_code == 200  # one failure: the next request may well succeed
        assert_error(client.post("/v1/generate", json=body), 500)
        for response in (client.get("/ready"), client.get("/health"), client.post("/v1/generate", json=body)):
            error = assert_error(response, 503, error_type="not_ready")
            assert "model steps all failed" in error["message"] and "CUDA" not in error["message"]
        assert "tad_ready 0.0" in client.get("/metrics").text


def test_one_success_between_failures_keeps_the_replica_in(
    service_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine.decoding import DecodeBatch

    original = DecodeBatch.step

    def failing_step(self: DecodeBatch) -> None:
        raise RuntimeError("out of memory")

    with make_client(service_settings, broken_after_failed_steps=2) as client:
        body = {"prompt": "a", "max_new_tokens": 3}
        monkeypatch.setattr(DecodeBatch, "step", failing_step)
        assert_error(client.post("/v1/generate", json=body), 500)
        monkeypatch.setattr(DecodeBatch, "step", original)
        assert client.post("/v1/generate", json=body).status_code == 200
        monkeypatch.setattr(DecodeBatch, "step", failing_step)
        assert_error(client.post("/v1/generate", json=body), 500)
        assert client.get("/ready").status_code == 200 and client.get("/health").status_code == 200


def test_a_decode_step_failing_every_time_takes_the_replica_out_though_its_prefills_succeed(
    service_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine.decoding import DecodeBatch

    def failing_step(self: DecodeBatch) -> None:
        raise RuntimeError("out of memory")  # e.g. once the batch has grown: every prefill alone still fits

    with make_client(service_settings, broken_after_failed_steps=2) as client:
        monkeypatch.setattr(DecodeBatch, "step", failing_step)
        body = {"prompt": "a", "max_new_tokens": 3}
        assert_error(client.post("/v1/generate", json=body), 500)
        assert client.get("/ready").status_code == 200
        assert_error(client.post("/v1/generate", json=body), 500)
        error = assert_error(client.get("/ready"), 503, error_type="not_ready")
        assert "the last 2 decode steps all failed" in error["message"]


def test_failing_scoring_passes_count_too_and_tad_ready_follows_the_state(
    service_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    with make_client(service_settings, broken_after_failed_steps=2) as client:
        runtime = client.app.state.runtime  # type: ignore[attr-defined]

        def failing_scoring(*args: object, **kwargs: object) -> None:
            raise RuntimeError("CUDA error: device-side assert triggered")

        monkeypatch.setattr(runtime.engine, "start_scoring", failing_scoring)
        body = {"prompt": "a", "response": "b"}
        assert_error(client.post("/v1/score", json=body), 500)
        assert_error(client.post("/v1/score", json=body), 500)
        assert_error(client.get("/health"), 503)  # score-only traffic on a broken device is noticed
        assert "tad_ready 0.0" in client.get("/metrics").text
        runtime.scheduler.failures.record("scoring", succeeded=True)  # as after a pass that succeeded
        assert client.get("/health").status_code == 200
        assert "tad_ready 1.0" in client.get("/metrics").text  # back in rotation, not stuck at 0


def test_failed_start_is_reported_with_its_reason_in_the_log_only(
    service_settings: Settings, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    """/ready answers anyone: the reason (a path, a loader's own words) is for the operator's log."""
    missing = tmp_path / "no-such-model"
    with caplog.at_level("ERROR"), make_client(service_settings, ready=False, model=str(missing)) as client:
        deadline = time.monotonic() + 10
        while client.get("/ready").json()["error"]["message"].startswith("the model is still loading"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        error = assert_error(client.get("/ready"), 503)
    assert error["message"].startswith("startup failed") and str(missing) not in error["message"]
    assert any("model path not found" in record.getMessage() for record in caplog.records)


def test_429_when_the_in_flight_limit_is_reached(service_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.engine.decoding import DecodeBatch

    release, stepping = threading.Event(), threading.Event()
    original = DecodeBatch.step

    def held_step(self: DecodeBatch) -> None:
        stepping.set()
        release.wait(30)
        original(self)

    monkeypatch.setattr(DecodeBatch, "step", held_step)
    with make_client(service_settings, max_batch_size=1, max_queue=0) as client:
        results: list[int] = []
        worker = threading.Thread(
            target=lambda: results.append(client.post("/v1/generate", json={"prompt": "a"}).status_code)
        )
        worker.start()
        assert stepping.wait(30)  # the first request holds the only slot
        refused = client.post("/v1/generate", json={"prompt": "b", "max_new_tokens": 2})
        assert_error(refused, 429, error_type="overloaded")
        assert int(refused.headers["retry-after"]) >= 1
        assert_error(client.post("/v1/score", json={"prompt": "b", "response": "c"}), 429)
        release.set()
        worker.join(60)
        assert results == [200]
        assert client.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 2}).status_code == 200


def test_504_when_the_deadline_passes(service_settings: Settings) -> None:
    with make_client(
        service_settings, request_timeout_s=0.05, max_new_tokens_limit=2000, max_prompt_tokens=2000
    ) as client:
        response = client.post("/v1/generate", json={"prompt": "the", "max_new_tokens": 1500})
        assert_error(response, 504, error_type="deadline_exceeded")
        assert response.headers["x-should-retry"] == "false"  # OpenAI clients would rerun it twice otherwise
        assert client.get("/ready").status_code == 200
        # Streamed, the status is already 200 when the deadline passes: the error event says it, and the
        # metrics count both failures, which the request counter cannot tell apart from answers.
        stream = client.post("/v1/generate", json={"prompt": "the", "max_new_tokens": 1500, "stream": True})
        assert stream.status_code == 200 and "event: error" in stream.text and "deadline_exceeded" in stream.text
        assert 'tad_failed_generations_total{error_type="deadline_exceeded"} 2.0' in client.get("/metrics").text


def test_internal_errors_do_not_leak(service_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.engine.engine import Engine

    def broken(self, requests):
        raise RuntimeError("secret internal detail /home/user/weights")

    with make_client(service_settings) as client:
        monkeypatch.setattr(Engine, "start_prefill", broken)
        response = client.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 2})
        error = assert_error(response, 500)
        assert "secret" not in response.text and "weights" not in error["message"]
        monkeypatch.undo()
        assert client.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 2}).status_code == 200


HALF_EMOJI = "hi \ud83d"  # a string cut inside a surrogate pair, as JSON can carry it


@pytest.mark.parametrize(
    ("route", "payload", "param"),
    [
        ("/v1/generate", {"prompt": HALF_EMOJI}, "prompt"),
        ("/v1/generate", {"messages": [{"role": "user", "content": HALF_EMOJI}]}, "messages.0.content"),
        ("/v1/generate", {"prompt": "a", "stop": [HALF_EMOJI]}, "stop"),
        ("/v1/score", {"prompt": "a", "response": HALF_EMOJI}, "response"),
        ("/v1/completions", {"prompt": HALF_EMOJI}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": HALF_EMOJI}]}, "messages.0.content"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": HALF_EMOJI}]}]},
            "messages.0.content",
        ),
    ],
)
def test_a_lone_surrogate_is_refused_naming_the_field(
    client: TestClient, route: str, payload: dict, param: str
) -> None:
    if route.startswith("/v1/c"):
        payload = {"model": client.get("/v1/models").json()["data"][0]["id"], **payload}
    body = json.dumps(payload).encode()  # ASCII JSON: the half pair travels as the escape "\ud83d"
    response = client.post(route, content=body, headers={"content-type": "application/json"})
    error = assert_error(response, invalid_status(route), None, "invalid_request_error")
    assert error["param"].startswith(param), error


def test_an_operators_logprob_limit_names_the_field_the_route_takes(service_settings: Settings) -> None:
    with make_client(service_settings, max_top_logprobs=2) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        completion = client.post("/v1/completions", json={"model": model, "prompt": "a", "logprobs": 3})
        assert assert_error(completion, 400, "logprobs")["message"].startswith("logprobs must be at most 2")
        chat = {"model": model, "messages": [{"role": "user", "content": "a"}], "logprobs": True, "top_logprobs": 3}
        assert_error(client.post("/v1/chat/completions", json=chat), 400, "top_logprobs")
        assert_error(client.post("/v1/generate", json={"prompt": "a", "top_logprobs": 3}), 422, "top_logprobs")


def test_error_messages_do_not_repeat_long_client_input(client: TestClient) -> None:
    long_name = "m" * 5000
    chat = {"model": long_name, "messages": CHAT}
    error = assert_error(client.post("/v1/chat/completions", json=chat), 400, "model")
    assert long_name[:300] not in error["message"]
    error = assert_error(client.get(f"/v1/models/{long_name}"), 404, "model")
    assert len(error["message"]) < 400
    target = {"prompt": "a", "policy": {"target": "t" * 5000}}
    error = assert_error(client.post("/v1/generate", json=target), 422, "policy.target")
    assert "t" * 100 not in error["message"]


@pytest.mark.parametrize(
    ("route", "field", "extra"),
    [
        ("/v1/generate", "temperature", '"prompt": "a"'),
        ("/v1/generate", "top_p", '"prompt": "a"'),
        ("/v1/chat/completions", "temperature", '"model": "m", "messages": [{"role": "user", "content": "a"}]'),
        ("/v1/chat/completions", "presence_penalty", '"model": "m", "messages": [{"role": "user", "content": "a"}]'),
    ],
)
@pytest.mark.parametrize("literal", ["NaN", "Infinity"])
def test_a_number_that_is_not_finite_is_named_as_such(
    client: TestClient, route: str, field: str, extra: str, literal: str
) -> None:
    """Python's JSON reads NaN: pydantic's bounds then said "should be less than or equal to 2"."""
    body = f'{{{extra}, "{field}": {literal}}}'.encode()
    response = client.post(route, content=body, headers={"content-type": "application/json"})
    error = assert_error(response, invalid_status(route), field)
    assert error["message"] == f"{field}: Input should be a finite number"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"prompt": "hi", "max_new_tokens": ' + b"9" * 5000 + b"}", "more than 4300 digits"),
        (b'{"prompt": "\xff"}', "not UTF-8"),
    ],
)
def test_a_body_that_cannot_be_read_as_json_says_why(client: TestClient, body: bytes, said: str) -> None:
    response = client.post("/v1/generate", content=body, headers={"content-type": "application/json"})
    error = assert_error(response, 422, "body", "invalid_request_error")
    assert error["message"].startswith("body: could not be read as JSON: ") and said in error["message"], error


def test_a_model_step_running_past_the_request_timeout_asks_for_a_restart(service_settings: Settings) -> None:
    """A forward that never returns fails no step: the worker's pass running longer than any request may last
    is what shows it."""
    with make_client(service_settings, request_timeout_s=30.0) as client:
        scheduler = client.app.state.runtime.scheduler  # type: ignore[attr-defined]
        assert scheduler.pass_running_s == 0.0 and client.get("/health").status_code == 200
        scheduler._pass_started = time.monotonic() - 31.0  # as the worker leaves it, mid-pass
        generate = client.post("/v1/generate", json={"prompt": "a"})
        for response in (client.get("/health"), client.get("/ready"), generate):
            error = assert_error(response, 503, error_type="not_ready")
            assert re.search(r"has been in one pass of model steps for 3\d s", error["message"]), error
        scheduler._pass_started = None  # the step returned
        assert client.get("/health").status_code == 200 and client.get("/ready").status_code == 200
