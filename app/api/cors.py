"""CORS, with a refused preflight answered in the service's one error shape (Starlette's is plain text)."""

from __future__ import annotations

from fastapi.middleware.cors import CORSMiddleware
from starlette.datastructures import Headers
from starlette.responses import Response

from app.api.errors import error_response
from app.errors import InvalidRequest

# What Starlette names in "Disallowed CORS origin, method" -> the preflight request header it refused.
REFUSED_HEADER = {
    "origin": "Origin",
    "method": "Access-Control-Request-Method",
    "headers": "Access-Control-Request-Headers",
    "private-network": "Access-Control-Request-Private-Network",
}


class ErrorShapedCORSMiddleware(CORSMiddleware):
    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        failure = bytes(response.body).decode()  # "Disallowed CORS origin, method"
        refused = failure.removeprefix("Disallowed CORS ").split(", ")
        headers = {
            name: value for name, value in response.headers.items() if name not in ("content-type", "content-length")
        }
        return error_response(
            response.status_code,
            InvalidRequest.error_type,
            f"{failure}: this service's CORS settings (TAD_CORS_ORIGINS) do not allow the preflight's "
            + ", ".join(REFUSED_HEADER.get(item, item) for item in refused),
            REFUSED_HEADER.get(refused[0], refused[0]),
            headers,
        )
