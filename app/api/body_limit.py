"""413 for request bodies over the limit, checked before the app reads (or parses) them."""

from __future__ import annotations

import json

from app.api.asgi import ASGIApp, Message, Receive, Scope, Send
from app.errors import PayloadTooLarge, error_body


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send)
            return
        # Read the whole body here (it is bounded), then hand it to the app unchanged.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._reject(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, send: Send) -> None:
        # Answered here, before FastAPI and its exception handlers ever see the request.
        error = PayloadTooLarge(f"request body exceeds the limit of {self.max_bytes} bytes")
        payload = json.dumps(error_body(error.status_code, error.error_type, error.message)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": error.status_code,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})
