"""FastAPI dependencies, as `Annotated` aliases for the routes."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from app.api.request_id import request_id
from app.errors import Unauthorized
from app.serving.runtime import Runtime
from app.serving.service import GenerationService


# The dependencies are coroutines though none awaits: FastAPI runs a plain `def` dependency on its thread
# pool, a thread hop per dependency per request that the event loop pays for (docs/performance.md).
async def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_service(request: Request, runtime: RuntimeDep) -> GenerationService:
    """The generation service; 503 until the model is loaded."""
    return GenerationService(runtime, request_id=request_id(request))


ServiceDep = Annotated[GenerationService, Depends(get_service)]


# Declared as security schemes so the OpenAPI schema (and Swagger UI's Authorize button) says how to
# send the key; neither refuses a request itself (auto_error=False): require_api_key decides.
_bearer_key = HTTPBearer(
    scheme_name="BearerKey", auto_error=False, description="The service's API key (TAD_API_KEY) as a Bearer token."
)
_header_key = APIKeyHeader(
    name="X-API-Key", scheme_name="HeaderKey", auto_error=False, description="The service's API key (TAD_API_KEY)."
)


async def require_api_key(
    runtime: RuntimeDep,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer_key)],
    header_key: Annotated[str | None, Depends(_header_key)],
) -> None:
    """When TAD_API_KEY is set, every /v1 route needs it (Bearer token or X-API-Key), compared in constant time."""
    refusal = key_refusal(runtime.settings.api_key, bearer.credentials if bearer is not None else None, header_key)
    if refusal is not None:
        raise refusal


def key_refusal(expected: SecretStr | None, *presented: str | None) -> Unauthorized | None:
    """Either header may carry the key, and one that does is enough: the `openai` client always sends a
    Bearer token (its own `api_key`), so a key in `X-API-Key` beside it must still be accepted."""
    if expected is None:
        return None
    key = expected.get_secret_value().encode("utf-8", "surrogateescape")
    matches = [secrets.compare_digest(p.encode("utf-8", "surrogateescape"), key) for p in presented if p is not None]
    if not any(matches):
        return Unauthorized("missing or invalid API key", headers={"WWW-Authenticate": "Bearer"})
    return None


def unauthenticated(request: Request) -> Unauthorized | None:
    """The 401 a request to a route that needs the key gets before its body is judged: FastAPI reads and
    validates a body before the route's dependencies run, so a malformed body would otherwise be answered
    (a 422 or 400) to a client without the key."""
    if not _needs_key(request.scope.get("route")):
        return None
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    presented = credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None
    return key_refusal(request.app.state.runtime.settings.api_key, presented, request.headers.get("x-api-key"))


def _needs_key(route: object) -> bool:
    dependant = getattr(route, "dependant", None)
    pending = list(dependant.dependencies) if dependant is not None else []
    while pending:
        dependency = pending.pop()
        if dependency.call is require_api_key:
            return True
        pending.extend(dependency.dependencies)
    return False


ApiKeyDep = Depends(require_api_key)
