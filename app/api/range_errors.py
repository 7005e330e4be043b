"""A refused byte range (`Range` header) in the service's one error shape; Starlette answers it in plain text.

Static files and report PNGs honour `Range`; a malformed one gets Starlette's plain-text 400 and one
past the end of the file a bare 416. Both are rewritten on the way out, their other headers
(`Content-Range`) kept.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import FileResponse
from starlette.staticfiles import StaticFiles

from app.api.asgi import Message, Receive, Scope, Send
from app.errors import InvalidRequest, error_body

RANGE_REFUSALS = frozenset({400, 416})
REPLACED_HEADERS = frozenset({b"content-type", b"content-length"})


def _message(status: int, plain_text: str, headers: list[tuple[bytes, bytes]]) -> str:
    if status == 400:  # Starlette's "Range header: start must be less than end", "Malformed range header."
        reason = plain_text.strip().removeprefix("Range header: ") or "malformed"
        return f"Range: {reason}"
    content_range = dict(headers).get(b"content-range", b"").decode("latin-1")
    size = content_range.rpartition("/")[2]
    return f"Range: no requested range starts inside the file ({size} bytes)"


def _plain_text_refusal(start: Message) -> bool:
    content_type = dict(start.get("headers", [])).get(b"content-type", b"text/plain")
    return start["status"] in RANGE_REFUSALS and content_type.startswith(b"text/plain")


def shaped_range_refusals(send: Send) -> Send:
    """`send`, with a 400 or 416 response's plain-text body replaced by the error shape."""
    refused: dict[str, Any] = {}

    async def shaped(message: Message) -> None:
        if message["type"] == "http.response.start" and _plain_text_refusal(message):
            refused["status"] = message["status"]
            refused["headers"] = [(k, v) for k, v in message.get("headers", []) if k.lower() not in REPLACED_HEADERS]
            return
        if refused and message["type"] == "http.response.body":
            status, headers = refused.pop("status"), refused.pop("headers")
            text = bytes(message.get("body", b"")).decode("utf-8", "replace")
            error_type = InvalidRequest.error_type if status == 400 else "range_not_satisfiable"
            body = json.dumps(error_body(status, error_type, _message(status, text, headers), "Range")).encode()
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        await send(message)

    return shaped


class RangeShapedFileResponse(FileResponse):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, shaped_range_refusals(send))


class RangeShapedStaticFiles(StaticFiles):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, shaped_range_refusals(send))
