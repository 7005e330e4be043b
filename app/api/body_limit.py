"""413 for request bodies over the limit, and 408 for one that does not arrive in time, checked before the
app reads (or parses) them."""

from __future__ import annotations

import asyncio
import json

from app.api.asgi import ASGIApp, Message, Receive, Scope, Send
from app.errors import BodyTimeout, PayloadTooLarge, ServiceError, error_body


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send, PayloadTooLarge(f"request body exceeds the limit of {self.max_bytes} bytes"))
            return
        # Read the whole body here (it is bounded in size and in time), then hand it to the app unchanged.
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._read(receive)
        except TimeoutError:
            await self._reject(send, BodyTimeout(f"the request body did not arrive within {self.timeout_s:g} s"))
            return
        if body is None:  # the client left
            return
        if isinstance(body, PayloadTooLarge):
            await self._reject(send, body)
            return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes | PayloadTooLarge | None:
        """The whole body; None when the client left. Answering is left to the caller, outside the time limit."""
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return PayloadTooLarge(f"request body exceeds the limit of {self.max_bytes} bytes")
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    async def _reject(self, send: Send, error: ServiceError) -> None:
        # Answered here, before FastAPI and its exception handlers ever see the request.
        payload = json.dumps(error_body(error.status_code, error.error_type, error.message)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": error.status_code,
                # The rest of the body is not read: the connection goes with it, or a client still sending
                # (byte by byte) would keep it open.
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
