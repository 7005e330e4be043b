"""Typed service errors, the one error body and how a validation error is described.

Every error body has the same (OpenAI-compatible) shape:
    {"error": {"message": str, "type": str, "param": str | null, "code": int}}
The layers below the API raise these errors; `app/api/errors.py` maps each to its HTTP response.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

from pydantic import BaseModel


class ServiceError(Exception):
    status_code: int = 500
    error_type: str = "internal_error"

    def __init__(self, message: str, param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}


class InvalidRequest(ServiceError):
    status_code = 422
    error_type = "invalid_request_error"


class Unauthorized(ServiceError):
    status_code = 401
    error_type = "authentication_error"


class Forbidden(ServiceError):
    status_code = 403
    error_type = "forbidden"


class PayloadTooLarge(ServiceError):
    status_code = 413
    error_type = "payload_too_large"


class BodyTimeout(ServiceError):
    """The request's body did not arrive in time (a client sending it byte by byte holds a connection)."""

    status_code = 408
    error_type = "request_timeout"


class Conflict(ServiceError):
    """The request is valid but the service's state refuses it (e.g. an artifact that does not fit)."""

    status_code = 409
    error_type = "conflict"


class Overloaded(ServiceError):
    status_code = 429
    error_type = "overloaded"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, retry_after_s))})


class NotReady(ServiceError):
    status_code = 503
    error_type = "not_ready"

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class DeadlineExceeded(ServiceError):
    status_code = 504
    error_type = "deadline_exceeded"

    def __init__(self, message: str, param: str | None = None, headers: dict[str, str] | None = None) -> None:
        # The OpenAI clients retry a 5xx twice by default: a request that ran out of time would run
        # (and time out) three times. This header is theirs for "do not retry".
        super().__init__(message, param, {"x-should-retry": "false", **(headers or {})})


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorBody(BaseModel):
    """The body of every non-2xx response."""

    error: ErrorDetail


def error_body(status: int, error_type: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "bytes", "dict", "list", "none"})


def _is_union_member(part: object) -> bool:
    """Pydantic locates an error inside a union by the member's type ('str', 'list[constrained-str]'):
    a label of the schema, not a field the client sent."""
    return isinstance(part, str) and (part in _TYPE_NAMES or "[" in part or "-" in part)


def _field_path(location: tuple[Any, ...] | list[Any], root: str) -> str:
    parts = [p for p in location if p not in ("body", "query", "path", "header")]
    # The first part is always a field (or header) name; union labels can only follow it.
    named = parts[:1] + [p for p in parts[1:] if not _is_union_member(p)]
    return ".".join(str(p) for p in named) or root


def _error_field(item: dict[str, Any], root: str) -> str:
    # A body that is not JSON is located at ("body", <character offset>): the field is the body.
    if item.get("type") == "json_invalid":
        return root
    return _field_path(item.get("loc", ()), root)


# The problems a message lists: a body with a wrong value in each of 150,000 list items had every one
# described (a 6.6 MB answer, built and sent on the event loop: every other request waited two seconds).
MAX_DESCRIBED_ERRORS = 5
# Pydantic's error types for a field refused whole (extra_forbidden) or for any value but the one it takes.
UNSUPPORTED_VALUE = frozenset({"extra_forbidden", "none_required", "literal_error"})
# Pydantic's error types for a value that should have been an object (a JSON object, a model's fields).
OBJECT_EXPECTED = frozenset({"model_type", "model_attributes_type", "dict_type"})


def validation_message(
    errors: Sequence[dict[str, Any]], root: str = "body", unsupported: Collection[str] = ()
) -> tuple[str, str]:
    """('field: problem; ...', first field) from pydantic errors, without echoing input values; `root` names
    the whole validated object (a request's body, an artifact's manifest); `unsupported`: fields the API
    defines and this service does not take (called so, not unknown). Only the first MAX_DESCRIBED_ERRORS
    problems are described; the message counts the rest."""
    described = []
    for item in errors[:MAX_DESCRIBED_ERRORS]:
        message = str(item.get("msg", "invalid value")).removeprefix("Value error, ")
        if item.get("type") in OBJECT_EXPECTED:  # pydantic names its model class ("... instance of Manifest")
            message = "Input should be an object"
        # An API's field this service lacks (unknown to its schema), or one it takes only at the value that asks
        # for nothing (null, 'none', ['text']): either way what was asked is not supported, not mistyped.
        field = re.sub(r"(\.\d+)+$", "", _error_field(item, root))  # modalities.0: the list's field
        if item.get("type") in UNSUPPORTED_VALUE and field in unsupported:
            message = "not supported by this service"
            if item.get("type") == "literal_error":
                message += f" (only {item.get('ctx', {}).get('expected')})"
        if item.get("type") == "too_long" and isinstance(item.get("input"), str):
            # A bound on a text-or-list field (a message's content) counts a text's characters, not "items".
            context = item.get("ctx", {})
            message = f"Text should have at most {context.get('max_length')} characters, not {len(item['input'])}"
        if item.get("type") == "json_invalid" and len(item.get("loc", ())) > 1:
            message = f"{message} at character {item['loc'][-1]}"
        described.append(f"{_error_field(item, root)}: {message}")
    if len(errors) > MAX_DESCRIBED_ERRORS:
        described.append(f"and {len(errors) - MAX_DESCRIBED_ERRORS} more problems")
    first = _error_field(errors[0], root) if errors else root
    return "; ".join(described), first
