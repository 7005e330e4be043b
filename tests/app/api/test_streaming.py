"""The one streaming path: a stream with nothing to send for a while keeps its connection alive."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.api.streaming import stream_response
from app.serving.events import KeepAlive
from app.settings import RejectAction, Settings
from tests.app.service_client import make_client


def raw_lines(
    settings: Settings, slow_model: Path, action: str, keep_alive_s: float, tokens: int = 500
) -> tuple[list[str], float]:
    """A long rejected answer's stream, line by line, and the seconds it lasted."""
    overrides = {
        "model": str(slow_model),
        "artifact_dir": None,  # baselines decide: the fallback threshold rejects every answer
        "fallback_threshold": -1.0,
        "max_new_tokens_limit": 1500,
        "stream_keepalive_s": keep_alive_s,
        "reject_action": RejectAction.WITHHOLD,
    }
    with make_client(settings, **overrides) as client:
        request = {"prompt": "the", "max_new_tokens": tokens, "stream": True, "policy": {"action": action}}
        started = time.monotonic()
        with client.stream("POST", "/v1/generate", json=request) as response:
            assert response.status_code == 200
            return [line for line in response.iter_lines() if line], time.monotonic() - started


def test_a_held_stream_sends_keep_alives_until_its_final_event(service_settings: Settings, slow_model: Path) -> None:
    lines, _ = raw_lines(service_settings, slow_model, "withhold", keep_alive_s=0.1)
    events = [line for line in lines if line.startswith("event: ")]
    assert events == ["event: final"]  # withheld: no token was sent
    assert lines.count(": keep-alive") >= 2  # the 500 tokens take a second or more


def test_a_stream_sending_tokens_needs_no_keep_alive(service_settings: Settings, slow_model: Path) -> None:
    # Tokens come every few ms: a keep-alive here would mean a sent token did not count as traffic. The stream
    # lasts several keep-alive periods (or the check could not fail); a period of 1 s leaves room for a stall
    # of the shared machine between two tokens.
    lines, seconds = raw_lines(service_settings, slow_model, "flag", keep_alive_s=1.0, tokens=1500)
    assert seconds > 2.0
    assert lines.count("event: token") == 1500 and ": keep-alive" not in lines


def test_a_response_that_ends_before_its_stream_is_read_cancels_the_generation() -> None:
    """A client gone before the first read: the stream never runs, and the generation must still stop."""
    cancelled: list[object] = []
    gone: list[object] = []
    item = SimpleNamespace(timing=lambda now: ("timing at", now))
    service = SimpleNamespace(
        scheduler=SimpleNamespace(cancel=cancelled.append),
        runtime=SimpleNamespace(metrics=SimpleNamespace(observe_client_gone=gone.append)),
    )
    response = stream_response(service, SimpleNamespace(item=item), encoder=None)  # type: ignore[arg-type]

    async def closed(message: dict) -> None:
        raise OSError("the client closed the connection")

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "method": "POST", "headers": []}
    with contextlib.suppress(Exception):
        asyncio.run(response(scope, receive, closed))
    assert cancelled == [item]
    assert len(gone) == 1 and gone[0][0] == "timing at"  # counted, its wait with it: no `service.stream` ran to


def test_events_already_waiting_go_out_in_one_write_and_the_opening_at_once() -> None:
    """A stream behind its steps: the events queued for it are sent together, one pass through the ASGI stack;
    a keep-alive sends what is written at once."""
    encoder = SimpleNamespace(
        opening=lambda: ["open\n"], final=lambda event: [f"event {event}\n"], error=list, done=lambda: ["done\n"]
    )
    item = SimpleNamespace(events=asyncio.Queue())

    async def stream(submitted: object, keep_alive: bool) -> AsyncIterator[object]:
        for burst in ([0, 1, 2], [3, 4, 5]):  # as a step's events are delivered to the event loop together
            for event in burst:
                item.events.put_nowait(event)
            while not item.events.empty():
                event = item.events.get_nowait()
                yield event
                if event == 3:
                    yield KeepAlive()  # nothing else for a while (a check pass): everything written goes out

    service = SimpleNamespace(stream=stream, scheduler=SimpleNamespace(cancel=lambda item: None))
    response = stream_response(service, SimpleNamespace(item=item), encoder)  # type: ignore[arg-type]

    async def chunks() -> list[str]:
        return [chunk async for chunk in response.body_iterator]  # type: ignore[misc]

    assert asyncio.run(chunks()) == [
        "open\n",
        "event 0\nevent 1\nevent 2\n",
        "event 3\n: keep-alive\n\n",
        "event 4\nevent 5\n",
        "done\n",
    ]


def test_a_client_gone_before_a_withheld_burst_is_noticed_not_written_to(
    service_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # A withheld stream sends nothing until the decision, then every held token at once. If the client has
    # left, that burst used to go whole to the closed socket, asyncio logging a warning per failed write.
    import httpx

    from tests.app.live_server import live_server

    request = {
        "prompt": "the",
        "max_new_tokens": service_settings.max_new_tokens_limit,
        "stream": True,
        "policy": {"method": "msp", "threshold": 1e9, "action": "withhold"},  # accepted, so the burst comes
    }
    with (
        live_server(service_settings) as url,
        httpx.Client(base_url=url, timeout=30) as client,
        caplog.at_level(logging.WARNING, logger="asyncio"),
    ):
        for _ in range(3):
            with client.stream("POST", "/v1/generate", json=request) as response:
                assert response.status_code == 200
                next(response.iter_lines())  # then leave
            time.sleep(1.0)
        assert client.get("/ready").status_code == 200
    failed_writes = [r for r in caplog.records if "socket.send() raised exception" in r.getMessage()]
    assert failed_writes == []


def test_a_stream_left_mid_answer_counts_as_a_client_disconnect(service_settings: Settings, slow_model: Path) -> None:
    import httpx

    from tests.app.live_server import live_server

    settings = service_settings.model_copy(
        update={"model": str(slow_model), "artifact_dir": None, "max_new_tokens_limit": 1500}
    )
    request = {"prompt": "the", "max_new_tokens": 1500, "stream": True}
    metric = 'tad_failed_generations_total{error_type="client_disconnected"}'
    with live_server(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        with client.stream("POST", "/v1/generate", json=request) as response:
            lines = response.iter_lines()
            while not next(lines).startswith("event: token"):
                pass  # then leave, mid-answer
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and f"{metric} 1.0" not in client.get("/metrics").text:
            time.sleep(0.1)
        assert f"{metric} 1.0" in client.get("/metrics").text


def test_an_unexpected_error_mid_stream_ends_it_with_an_error_event_not_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    encoder = SimpleNamespace(
        opening=list,
        final=lambda event: [f"final {event}\n"],
        error=lambda error: [f"error {error.error_type}: {error.message}\n"],
        done=lambda: ["done\n"],
    )
    item = SimpleNamespace(events=asyncio.Queue())

    async def stream(submitted: object, keep_alive: bool) -> AsyncIterator[object]:
        yield "answered"
        raise RuntimeError("/secret/path: tensor a (3) must match tensor b (4)")

    service = SimpleNamespace(stream=stream, scheduler=SimpleNamespace(cancel=lambda item: None))
    response = stream_response(service, SimpleNamespace(item=item), encoder)  # type: ignore[arg-type]

    async def chunks() -> str:
        return "".join([chunk async for chunk in response.body_iterator])  # type: ignore[misc]

    with caplog.at_level(logging.ERROR):
        sent = asyncio.run(chunks())
    assert sent.endswith("error internal_error: internal server error\ndone\n") and sent.startswith("final answered")
    assert "secret" not in sent and "tensor a" in caplog.text
