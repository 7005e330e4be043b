"""The one streaming path: a generation's events, encoded by its protocol, as server-sent events."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.errors import ServiceError
from app.numeric import finite_tree
from app.serving.events import KeepAlive, StreamedToken
from app.serving.outcomes import GenerationOutcome, Submitted
from app.serving.service import GenerationService

logger = logging.getLogger(__name__)


class StreamEncoder(Protocol):
    """How one protocol spells the parts of a stream (each returns the text chunks to send)."""

    def opening(self) -> list[str]: ...

    def token(self, event: StreamedToken) -> list[str]: ...

    def final(self, outcome: GenerationOutcome) -> list[str]: ...

    def error(self, error: ServiceError) -> list[str]: ...

    def done(self) -> list[str]: ...


# An SSE comment: every client ignores it (the spec says so), proxies see traffic.
KEEP_ALIVE = ": keep-alive\n\n"


def json_text(data: Any) -> str:
    """Compact JSON for stream events; a non-finite number becomes null (JSON has no NaN or inf)."""
    return json.dumps(finite_tree(data), separators=(",", ":"), allow_nan=False)


def sse_event(event: str, data: object) -> str:
    return f"event: {event}\ndata: {json_text(data)}\n\n"


def sse_data(data: object) -> str:
    return f"data: {json_text(data)}\n\n"


class GenerationStream(StreamingResponse):
    """A StreamingResponse that cancels its generation when it ends, however it ends.

    Reading the stream to its end or closing it midway cancels through `service.stream`; but a client
    that leaves before the first read, or a send that fails at the start, ends the response without the
    stream ever running, and the generation would hold its batch slot until it finished.
    """

    def __init__(self, content: AsyncIterator[str], cancel: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._cancel = cancel

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._cancel()  # a no-op for a generation that has already answered


def stream_response(service: GenerationService, submitted: Submitted, encoder: StreamEncoder) -> StreamingResponse:
    """Server-sent events for a submitted generation; a consumer that goes away cancels it."""
    streaming = False  # `service.stream` has begun, and counts a consumer gone from then on

    async def chunks() -> AsyncIterator[str]:
        nonlocal streaming
        # The events already waiting go out in one write: a stream that fell behind its steps catches up
        # with one pass through the ASGI stack and one socket write instead of one per token. A keep-alive
        # (nothing else is coming for a while) sends everything at once.
        waiting = submitted.item.events
        if opening := "".join(encoder.opening()):
            yield opening  # at once: the client sees the answer begin before its first token is computed
        written: list[str] = []
        streaming = True
        try:
            async for event in service.stream(submitted, keep_alive=True):
                if isinstance(event, KeepAlive):
                    written.append(KEEP_ALIVE)
                else:
                    written += encoder.token(event) if isinstance(event, StreamedToken) else encoder.final(event)
                if isinstance(event, KeepAlive) or waiting.empty():
                    yield "".join(written)
                    written.clear()
        except ServiceError as error:
            written += encoder.error(error)
        except Exception:
            # The 200 is long sent: the client gets an error event and the stream's proper end, the operator the
            # traceback, and nobody the exception's own text.
            logger.exception("unexpected error in a stream")
            written += encoder.error(ServiceError("internal server error"))
        if last := "".join([*written, *encoder.done()]):
            yield last

    def cancel() -> None:
        if not streaming:  # gone before the stream began (while its opening was written): counted here
            service.runtime.metrics.observe_client_gone(submitted.item.timing(time.monotonic()))
        service.scheduler.cancel(submitted.item)

    return GenerationStream(chunks(), cancel=cancel)
