"""Optional API key: required on /v1/*, compared in constant time; ops routes stay open."""

from __future__ import annotations

from unittest.mock import ANY

import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from tests.app.api.test_errors import assert_error
from tests.app.service_client import make_client


def test_api_key_guards_v1_routes(service_settings: Settings) -> None:
    with make_client(service_settings, api_key="s3cret") as client:
        request = {"prompt": "the", "max_new_tokens": 2}
        assert_error(client.post("/v1/generate", json=request), 401, error_type="authentication_error")
        wrong = client.post("/v1/generate", json=request, headers={"Authorization": "Bearer nope"})
        assert_error(wrong, 401)
        assert wrong.headers["www-authenticate"] == "Bearer"
        assert_error(client.get("/v1/models"), 401)
        assert_error(client.get("/info"), 401)  # it names paths
        assert client.get("/info", headers={"X-API-Key": "s3cret"}).status_code == 200
        assert client.post("/v1/generate", json=request, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert client.post("/v1/generate", json=request, headers={"X-API-Key": "s3cret"}).status_code == 200
        # The openai client always sends its own Bearer token: a key in X-API-Key beside it is enough.
        beside = {"Authorization": "Bearer unused", "X-API-Key": "s3cret"}
        assert client.post("/v1/generate", json=request, headers=beside).status_code == 200
        assert_error(client.post("/v1/generate", json=request, headers={**beside, "X-API-Key": "nope"}), 401)
        for open_route in ("/health", "/ready", "/metrics"):
            assert client.get(open_route).status_code == 200


def test_cors_is_off_unless_configured(service_settings: Settings) -> None:
    preflight = {"Origin": "https://example.org", "Access-Control-Request-Method": "POST"}
    with make_client(service_settings) as client:
        response = client.options("/v1/generate", headers=preflight)
        assert "access-control-allow-origin" not in response.headers
    with make_client(service_settings, cors_origins=["https://example.org"]) as client:
        response = client.options("/v1/generate", headers=preflight)
        assert response.headers["access-control-allow-origin"] == "https://example.org"
        # A refused preflight in the one error shape (Starlette's own is plain text), naming what it refused.
        refused = client.options("/v1/generate", headers={**preflight, "Origin": "https://evil.example"})
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["type"] == "invalid_request_error" and error["param"] == "Origin"
        assert error["message"].startswith("Disallowed CORS origin")
        refused = client.options("/v1/generate", headers={**preflight, "Access-Control-Request-Method": "DELETE"})
        assert refused.json()["error"]["param"] == "Access-Control-Request-Method"
        # OpenAI's JS SDK in a browser sends headers of its own beside the key.
        sdk_headers = "authorization,content-type,x-stainless-os,x-stainless-retry-count"
        response = client.options(
            "/v1/chat/completions", headers={**preflight, "Access-Control-Request-Headers": sdk_headers}
        )
        assert response.status_code == 200
        assert "x-stainless-os" in response.headers["access-control-allow-headers"].lower()


def test_cors_preflights_are_counted_apart_from_the_route_they_ask_about(service_settings: Settings) -> None:
    preflight = {"Origin": "https://example.org", "Access-Control-Request-Method": "POST"}
    with make_client(service_settings, cors_origins=["https://example.org"]) as client:
        registry = client.app.state.runtime.metrics.registry

        def count(route: str) -> float:
            return registry.get_sample_value("tad_requests_total", {"route": route, "status": "200"}) or 0.0

        before = count("/v1/generate"), count("preflight")
        assert client.options("/v1/generate", headers=preflight).status_code == 200
        # not a generation: the route's 200s (the 429 alert's denominator) are left alone
        assert (count("/v1/generate"), count("preflight")) == (before[0], before[1] + 1)
        assert registry.get_sample_value("tad_requests_in_flight") == 0


def _unauthenticated_statuses(client: TestClient) -> dict[tuple[str, str], tuple[bool, int]]:
    """Per operation of the served schema: whether it declares a key, and its status when sent none."""
    schema = client.get("/openapi.json").json()
    statuses = {}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            response = client.request(method, path.replace("{model_id}", "any"), json={})
            statuses[(method, path)] = ("security" in operation, response.status_code)
    return statuses


def test_schema_declares_the_key_exactly_where_it_is_required(service_settings: Settings) -> None:
    with make_client(service_settings, api_key="s3cret") as client:
        schemes = client.get("/openapi.json").json()["components"]["securitySchemes"]
        assert schemes["BearerKey"] == {"type": "http", "scheme": "bearer", "description": ANY}
        assert schemes["HeaderKey"]["in"] == "header" and schemes["HeaderKey"]["name"] == "X-API-Key"
        statuses = _unauthenticated_statuses(client)
        # What operations.md lists: a route that lost both its declaration and its check would pass the loop below.
        documented = {
            key for key in statuses if key[1].startswith("/v1/") or key[1] in ("/info", "/admin/reload-artifact")
        }
        assert {("post", "/v1/generate"), ("get", "/info"), ("post", "/admin/reload-artifact")} <= documented
        assert {key for key, (declared, _) in statuses.items() if declared} == documented
        for key, (declared, status) in statuses.items():
            assert declared == (status == 401), (key, status)
    with make_client(service_settings) as client:
        assert "securitySchemes" not in client.get("/openapi.json").json()["components"]
        for key, (declared, status) in _unauthenticated_statuses(client).items():
            assert not declared and status != 401, key


@pytest.mark.parametrize("route", ["/v1/generate", "/v1/chat/completions"])
def test_a_body_is_judged_only_for_a_client_with_the_key(service_settings: Settings, route: str) -> None:
    """FastAPI reads a body before the route's dependencies run: a malformed one was answered, to a client
    without the key, with what was wrong in it."""
    json_header = {"content-type": "application/json"}
    with make_client(service_settings, api_key="s3cret") as client:
        for body in (b"{bad", b"\xff\xfe not utf-8", b'{"prompt": 1}'):
            response = client.post(route, content=body, headers=json_header)
            assert response.status_code == 401 and response.json()["error"]["message"] == "missing or invalid API key"
            wrong = client.post(route, content=body, headers={**json_header, "Authorization": "Bearer wrong"})
            assert wrong.status_code == 401
            for key in (
                {"Authorization": "Bearer s3cret"},
                {"authorization": "bearer s3cret"},
                {"X-API-Key": "s3cret"},
                {"Authorization": "Bearer unused", "X-API-Key": "s3cret"},
            ):
                judged = client.post(route, content=body, headers={**json_header, **key})
                assert judged.status_code in (400, 422) and judged.json()["error"]["param"] is not None
    with make_client(service_settings) as client:  # no key set: the body's problem, as before
        assert client.post(route, content=b"{bad", headers=json_header).status_code in (400, 422)
