"""Every numeric limit the served schema declares is enforced, whatever else the request carries.

The limits are read from the deployment's own `/openapi.json` (so a new field or a changed
limit is tested without touching this file). Each value one past a bound must be a 422 naming
its field, sent alone and beside every other bounded field at an in-range value: one field
can override another (`max_completion_tokens` overrides `max_tokens`), and the overridden
field's bound still holds. Schemathesis found `max_tokens: 513` beside `max_completion_tokens`
answered 200.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from fastapi.testclient import TestClient

from tests.app.api.test_errors import assert_error
from tests.app.service_client import CHAT, invalid_status

BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _base_bodies(model: str) -> dict[str, dict[str, Any]]:
    """The smallest valid body of each route that takes one (a new route must be added here: KeyError)."""
    return {
        "/v1/generate": {"prompt": "a"},
        "/v1/score": {"prompt": "a", "response": "b"},
        "/v1/chat/completions": {"model": model, "messages": CHAT},
        "/v1/completions": {"model": model, "prompt": "a"},
    }


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _branches(schema: dict[str, Any], node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The schemas a value may match: the node itself, and each branch of an anyOf/oneOf."""
    node = _resolve(schema, node)
    yield node
    for key in ("anyOf", "oneOf"):
        for branch in node.get(key, []):
            yield from _branches(schema, branch)


def _bounded(schema: dict[str, Any], body: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple]:
    """(field path, numeric branch) for every number or integer with a declared bound, nested objects included."""
    for branch in _branches(schema, body):
        for name, field in branch.get("properties", {}).items():
            for option in _branches(schema, field):
                if option.get("type") in ("integer", "number") and any(bound in option for bound in BOUNDS):
                    yield (*path, name), option
                elif option.get("type") == "object" or "properties" in option:
                    yield from _bounded(schema, option, (*path, name))


def _outside(option: dict[str, Any]) -> list[Any]:
    """The values just past each bound: one past an integer's, the next float past a number's."""
    # The schema writes integer bounds as floats (`"minimum": 1.0`, a seed's 2**53 too): past it is an integer.
    integer = option["type"] == "integer"
    values: list[Any] = []
    if "maximum" in option:
        values.append(int(option["maximum"]) + 1 if integer else math.nextafter(option["maximum"], math.inf))
    if "minimum" in option:
        values.append(int(option["minimum"]) - 1 if integer else math.nextafter(option["minimum"], -math.inf))
    values += [option[bound] for bound in ("exclusiveMaximum", "exclusiveMinimum") if bound in option]
    return values


def _inside(option: dict[str, Any]) -> Any:
    """An in-range value: the inclusive minimum, else the inclusive maximum, else one inside an exclusive bound."""
    for bound in ("minimum", "maximum"):
        if bound in option:
            return int(option[bound]) if option["type"] == "integer" else option[bound]
    if "exclusiveMinimum" in option and "exclusiveMaximum" in option:
        return (option["exclusiveMinimum"] + option["exclusiveMaximum"]) / 2
    return option["exclusiveMinimum"] + 1 if "exclusiveMinimum" in option else option["exclusiveMaximum"] - 1


def _with(body: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """`body` with the (possibly nested) field at `path` set to `value`."""
    if not path:
        return value
    inner = body.get(path[0])
    return {**body, path[0]: _with(inner if isinstance(inner, dict) else {}, path[1:], value)}


def _request_schemas(served: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for route, operations in served["paths"].items():
        for operation in operations.values():
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                yield route, content["application/json"]["schema"]


def test_every_declared_numeric_limit_is_enforced_beside_any_other_field(client: TestClient) -> None:
    served = client.get("/openapi.json").json()
    model = served["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]["enum"][0]
    bases = _base_bodies(model)
    checked: set[tuple[str, str]] = set()
    for route, body_schema in _request_schemas(served):
        base = bases[route]
        fields = list(_bounded(served, body_schema))
        # The in-range companions are accepted together: a refusal below is then the bound's doing.
        in_range = base
        for path, option in fields:
            in_range = _with(in_range, path, _inside(option))
        if fields:
            assert client.post(route, json=in_range).status_code == 200, (route, in_range)
        for path, option in fields:
            param = ".".join(path)
            for value in _outside(option):
                companions: list[dict[str, Any]] = [base]
                companions += [_with(base, other, _inside(o)) for other, o in fields if other != path]
                for companion in companions:
                    body = _with(companion, path, value)
                    response = client.post(route, json=body)
                    assert response.status_code == invalid_status(route), (route, body, response.text)
                    assert_error(response, invalid_status(route), param, "invalid_request_error")
                checked.add((route, param))
    # What the schemathesis run missed, and the deployment limits the schema states: all found and tested.
    for expected in [
        ("/v1/chat/completions", "max_tokens"),
        ("/v1/chat/completions", "max_completion_tokens"),
        ("/v1/chat/completions", "top_logprobs"),
        ("/v1/completions", "max_tokens"),
        ("/v1/completions", "logprobs"),
        ("/v1/generate", "max_new_tokens"),
        ("/v1/generate", "top_logprobs"),
    ]:
        assert expected in checked, (expected, sorted(checked))


def test_an_overridden_max_tokens_is_still_held_to_its_bound(client: TestClient) -> None:
    """The case schemathesis found: `max_completion_tokens` is the one in force, `max_tokens` must still fit."""
    served = client.get("/openapi.json").json()
    limit = served["components"]["schemas"]["ChatCompletionRequest"]["properties"]["max_tokens"]["anyOf"][0]["maximum"]
    model = served["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]["enum"][0]
    body = {"model": model, "messages": CHAT, "max_completion_tokens": 1}
    error = assert_error(client.post("/v1/chat/completions", json={**body, "max_tokens": limit + 1}), 400, "max_tokens")
    assert str(limit) in error["message"]
    accepted = client.post("/v1/chat/completions", json={**body, "max_tokens": limit})
    assert accepted.status_code == 200 and accepted.json()["usage"]["completion_tokens"] == 1
