"""A request body must arrive whole, within its size limit and its time limit, before the app sees it."""

from __future__ import annotations

import json
import socket
import time
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
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    error = json.loads(body)["error"]
    assert error["type"] == "request_timeout" and "within 0.5 s" in error["message"]
    assert 0.4 < waited < 5


def test_a_body_that_arrives_in_time_is_served(service_settings: Settings) -> None:
    from fastapi.testclient import TestClient

    from tests.app.service_client import make_client

    with make_client(service_settings, body_timeout_s=5.0) as client:
        assert isinstance(client, TestClient)
        response = client.post("/v1/generate", json={"prompt": "the", "max_new_tokens": 1})
        assert response.status_code == 200
