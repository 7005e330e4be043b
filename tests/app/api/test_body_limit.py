"""A request body must arrive whole, within its size limit and its time limit, before the app sees it."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

from app.settings import Settings
from tests.app.live_server import live_server


def test_a_body_sent_too_slowly_gets_a_408_in_the_error_shape_and_frees_the_connection(
    service_settings: Settings,
) -> None:
    """A client announcing a body and sending it byte by byte (slow-loris) held its connection for as long as
    it kept sending: with no proxy in front, enough of them exhaust the server's sockets and memory."""
    settings = service_settings.model_copy(update={"body_timeout_s": 0.5})
    with live_server(settings) as url:
        address = urlsplit(url)
        with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
            connection.sendall(
                b"POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n" + b'{"prompt": "'
            )
            started = time.monotonic()
            reply = b""
            while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
                received = connection.recv(4096)
                if not received:
                    break
                reply += received
            waited = time.monotonic() - started
            try:  # still sending: the server has closed the connection all the same (an end, or a reset)
                connection.sendall(b"x")
                closed = connection.recv(4096) == b""
            except (ConnectionResetError, BrokenPipeError):
                closed = True
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    error = json.loads(body)["error"]
    assert error["type"] == "request_timeout" and "within 0.5 s" in error["message"]
    assert 0.4 < waited < 5 and closed


def test_the_time_limit_is_the_bodys_not_the_answers(service_settings: Settings, slow_model: Path) -> None:
    """A generation streaming for longer than the body's time limit is not cut by it."""
    from tests.app.service_client import make_client

    overrides = {"model": str(slow_model), "artifact_dir": None, "body_timeout_s": 0.05, "max_new_tokens_limit": 200}
    with make_client(service_settings, **overrides) as client:
        started = time.monotonic()
        request = {"prompt": "the", "max_new_tokens": 200, "stream": True}
        with client.stream("POST", "/v1/generate", json=request) as response:
            lines = [line for line in response.iter_lines() if line.startswith("event: ")]
        assert response.status_code == 200 and lines.count("event: token") == 200 and lines[-1] == "event: final"
        assert time.monotonic() - started > 0.05 * 4  # it did outlast the limit
