"""HEAD wherever GET is: GET's status and headers, no body."""

from __future__ import annotations

import asyncio

from fastapi.testclient import TestClient

from app.api.asgi import Message, Receive, Scope, Send
from app.api.head import HeadAsGetMiddleware


def test_head_answers_as_get(client: TestClient) -> None:
    for path in ("/health", "/ready", "/metrics", "/v1/models", "/", "/playground/static/app.js"):
        got, head = client.get(path), client.head(path)
        assert got.status_code == 200 and head.status_code == 200, path
        assert head.headers["content-type"] == got.headers["content-type"], path
        if path != "/metrics":  # its counters move with every request
            assert head.headers["content-length"] == str(len(got.content)), path


def _sent(method: str, chunks: list[bytes]) -> tuple[list[Message], list[str]]:
    """What the middleware sends for an app that answers in `chunks`, and the methods the app saw."""
    seen: list[str] = []
    sent: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["method"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
        for index, chunk in enumerate(chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": index < len(chunks) - 1})

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": "/x", "headers": []}
    asyncio.run(HeadAsGetMiddleware(app)(scope, receive, send))
    return sent, seen


def test_a_head_request_is_routed_as_get_and_its_body_never_sent() -> None:
    # TestClient drops a HEAD response's body itself: the middleware's own sends are what is checked here.
    sent, seen = _sent("HEAD", [b"01234", b"56789"])
    assert seen == ["GET"]
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["headers"] == [(b"content-length", b"10")] and sent[1]["body"] == b""
    assert not sent[1]["more_body"]
    sent, seen = _sent("GET", [b"01234", b"56789"])  # any other method passes through untouched
    assert seen == ["GET"] and b"".join(m.get("body", b"") for m in sent) == b"0123456789"


def test_head_on_a_post_only_route_is_still_refused(client: TestClient) -> None:
    response = client.head("/v1/generate")
    assert response.status_code == 405 and "POST" in response.headers["allow"]


def test_head_of_an_unknown_path_is_a_404(client: TestClient) -> None:
    assert client.head("/no-such-route").status_code == 404
