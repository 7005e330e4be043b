"""The one place that maps every error (and a client gone) to an HTTP response, in the one error shape
(`app/errors.py`).

Internal exception text never reaches a client.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import InvalidRequest, PayloadTooLarge, ServiceError, error_body, validation_message

logger = logging.getLogger(__name__)

CLIENT_CLOSED_REQUEST = 499  # nginx's code; the client is gone, so nobody receives it


def error_response(
    status: int, error_type: str, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, error_type, message, param), status_code=status, headers=headers)


def client_gone() -> Response:
    """The response for a request whose client disconnected (its work was cancelled)."""
    return Response(status_code=CLIENT_CLOSED_REQUEST)


def declares_json(content_type: str) -> bool:
    """Whether FastAPI reads a body with this content type as JSON: application/json or application/*+json
    (as fastapi.routing reads the media type; with no content type at all, its strict default reads none)."""
    media = content_type.split(";")[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def _body_not_read_as_json(errors: list[dict[str, Any]], content_type: str) -> bool:
    """The whole body refused as not an object, and the request did not say it sent JSON."""
    whole_body = len(errors) == 1 and tuple(errors[0].get("loc", ())) == ("body",)
    not_an_object = whole_body and errors[0].get("type") in ("model_attributes_type", "dict_type")
    return not_an_object and not declares_json(content_type)


def invalid_request_status(request: Request) -> int:
    """The status of an invalid request on the route it was sent to: a route class may declare its API's
    own (`invalid_request_status`: OpenAI's API answers 400); FastAPI's 422 otherwise."""
    return getattr(request.scope.get("route"), "invalid_request_status", InvalidRequest.status_code)


def unreadable_body_message(error: StarletteHTTPException) -> str:
    """What kept FastAPI from reading a body as JSON (its own detail says only that it could not): the cause's
    own text is Python's, not for a client."""
    cause = error.__cause__
    if isinstance(cause, UnicodeDecodeError):
        reason = "it is not UTF-8 text"
    elif isinstance(cause, ValueError) and "digits" in str(cause):
        reason = f"a number in it has more than {sys.get_int_max_str_digits()} digits"
    else:
        reason = str(error.detail)
    return f"body: could not be read as JSON: {reason}"


def install_error_handlers(app: FastAPI, unauthenticated: Callable[[Request], ServiceError | None]) -> None:
    """`unauthenticated`: the refusal a request without the API key its route needs gets before any complaint
    about its body (which FastAPI judges before the route's own checks run)."""

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, error: ServiceError) -> JSONResponse:
        status = invalid_request_status(request) if isinstance(error, InvalidRequest) else error.status_code
        return error_response(status, error.error_type, error.message, error.param, error.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        if (refusal := unauthenticated(request)) is not None:
            return await _service_error(request, refusal)
        errors = list(error.errors())
        content_type = request.headers.get("content-type", "")
        if _body_not_read_as_json(errors, content_type):
            # FastAPI parses a body as JSON only when it says it is JSON (curl -d sends a form by default).
            sent = content_type.split(";")[0] or "none"
            message = f"body: send a JSON object with the header content-type: application/json (this one: {sent})"
            return error_response(invalid_request_status(request), InvalidRequest.error_type, message, "body")
        unsupported = getattr(request.scope.get("route"), "unsupported_fields", ())
        message, field = validation_message(errors, unsupported=unsupported)
        return error_response(invalid_request_status(request), InvalidRequest.error_type, message, field)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == 400:  # a body FastAPI could not parse (e.g. not UTF-8): bad input, like any other
            if (refusal := unauthenticated(request)) is not None:
                return await _service_error(request, refusal)
            status = invalid_request_status(request)
            return error_response(status, InvalidRequest.error_type, unreadable_body_message(error), "body")
        error_type = {404: "not_found", 405: "method_not_allowed", 413: PayloadTooLarge.error_type}.get(
            error.status_code, "http_error"
        )
        return error_response(error.status_code, error_type, str(error.detail), None, getattr(error, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        # Starlette answers this one outside every middleware, RequestIdMiddleware too, so the id
        # it gave the request is put on the response (and in the log line) here.
        request_id = getattr(request.state, "request_id", None)
        logger.exception("unhandled error on %s %s (request id %s)", request.method, request.url.path, request_id)
        headers = {"X-Request-ID": request_id} if request_id else None
        return error_response(500, "internal_error", "internal server error", headers=headers)
