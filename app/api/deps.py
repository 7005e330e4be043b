"""FastAPI dependencies, as `Annotated` aliases for the routes."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request

from app.errors import Unauthorized
from app.serving.runtime import Runtime
from app.serving.service import GenerationService


def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def get_service(runtime: RuntimeDep) -> GenerationService:
    """The generation service; 503 until the model is loaded."""
    return GenerationService(runtime)


ServiceDep = Annotated[GenerationService, Depends(get_service)]


def _presented_key(request: Request) -> str | None:
    authorization = request.headers.get("authorization", "")
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() == "bearer" and credentials:
        return credentials.strip()
    return request.headers.get("x-api-key")


def require_api_key(request: Request, runtime: RuntimeDep) -> None:
    """When TAD_API_KEY is set, every /v1 route needs it (Bearer token or X-API-Key), compared in constant time."""
    expected = runtime.settings.api_key
    if expected is None:
        return
    presented = _presented_key(request)
    if presented is None or not secrets.compare_digest(
        presented.encode("utf-8", "surrogateescape"), expected.get_secret_value().encode("utf-8", "surrogateescape")
    ):
        raise Unauthorized("missing or invalid API key", headers={"WWW-Authenticate": "Bearer"})


ApiKeyDep = Depends(require_api_key)
