"""Every request gets an id: the client's `X-Request-ID` when it sends a usable one, else a new one.

The id comes back in the response's `X-Request-ID` header (errors included) and is written in the
decision log, so a client can find why an answer was rejected from its own logs.
"""

from __future__ import annotations

import re
import uuid

from fastapi import Request

from app.api.asgi import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
# Printable and short: it is echoed in a header and written to logs, so nothing that could split a line.
_USABLE = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def _chosen(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == HEADER:
            text = value.decode("latin-1")
            if _USABLE.fullmatch(text):
                return text
            break
    return uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _chosen(scope)
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message["headers"] = [*headers, (HEADER, request_id.encode("latin-1"))]
            await send(message)

        await self.app(scope, receive, send_with_id)


def request_id(request: Request) -> str | None:
    """The id RequestIdMiddleware gave this request (None outside the app, e.g. a bare test route)."""
    return getattr(request.state, "request_id", None)
