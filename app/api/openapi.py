"""OpenAPI declarations of the error responses every route can return."""

from __future__ import annotations

from typing import Any

from app.errors import ErrorBody

# One server-sent event (OpenAPI 3.2's itemSchema for text/event-stream, as FastAPI writes it).
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "data": {"type": "string"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer", "minimum": 0},
    },
}


def streamed(description: str) -> dict[str, Any]:
    """A 200 response that is JSON, or server-sent events when the request asks to stream."""
    return {"description": description, "content": {"text/event-stream": {"itemSchema": SSE_EVENT_SCHEMA}}}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    descriptions = {
        401: "Missing or invalid API key (only when TAD_API_KEY is set)",
        403: "A browser page from an origin TAD_CORS_ORIGINS does not list may not do this",
        404: "The requested model is not served here",
        408: "The request body did not all arrive within the body timeout",
        413: "Request body over the payload limit",
        409: "The service refused the action in its current state (e.g. an artifact that does not fit)",
        400: "Invalid request; `error.param` names the field (OpenAI's status for it; the native routes: 422)",
        422: "Invalid request; `error.param` names the field",
        429: "Too many requests in flight; retry after `Retry-After` seconds",
        503: "Not ready yet (model loading) or shutting down; see `Retry-After`",
        504: "The request ran past its deadline",
        500: "The model failed on this request (the body never carries the internal error; see the server log)",
    }
    return {code: {"model": ErrorBody, "description": descriptions[code]} for code in codes}


V1_ERRORS = errors(401, 408, 413, 422, 429, 500, 503, 504)
