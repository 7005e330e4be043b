"""Optional API key: required on /v1/*, compared in constant time; ops routes stay open."""

from __future__ import annotations

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
