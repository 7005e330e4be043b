"""The served schema states the deployment's policy choices: a policy it allows is one the service accepts."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from jsonschema import Draft202012Validator

from app.settings import Settings
from app.uncertainty.methods import Method
from tests.app.service_client import CHAT, make_client

POLICIES: list[dict[str, Any]] = [
    {},
    {"threshold": 0.5},
    {"target": "error@0.7"},
    *({"method": method.value} for method in Method),
    *({"method": method.value, "threshold": 0.5} for method in Method),
]


def _schema_allows(schema: dict[str, Any], policy: dict[str, Any]) -> bool:
    document = {"$ref": "#/components/schemas/PolicyOverride", "components": schema["components"]}
    return Draft202012Validator(document).is_valid(policy)


def _check_agreement(client: TestClient) -> tuple[int, int]:
    schema = client.get("/openapi.json").json()
    allowed = refused = 0
    for policy in POLICIES:
        response = client.post("/v1/score", json={"messages": CHAT, "response": "Paris.", "policy": policy})
        assert response.status_code in (200, 422), response.text
        assert _schema_allows(schema, policy) == (response.status_code == 200), (policy, response.json())
        allowed += response.status_code == 200
        refused += response.status_code == 422
    return allowed, refused


def test_with_an_artifact_schema_and_validation_agree(client: TestClient) -> None:
    allowed, refused = _check_agreement(client)
    assert allowed and refused  # a target the tiny artifact has not calibrated (error@0.7) is refused


@pytest.mark.parametrize("gated", [False, True])
def test_without_an_artifact_schema_and_validation_agree(service_settings: Settings, tmp_path, gated: bool) -> None:
    settings = service_settings.model_copy(update={"fallback_threshold": 1.0 if gated else None})
    with make_client(settings, artifact_dir=tmp_path / "none") as client:
        allowed, refused = _check_agreement(client)
        assert allowed and refused  # a bare threshold, TAD and the attention methods are refused


def test_each_route_declares_the_status_its_invalid_requests_get(client: TestClient) -> None:
    """OpenAI's routes answer an invalid request with a 400, as OpenAI does; the native ones with a 422. Each
    declares its own and not the other (FastAPI declares a 422 of its own shape on every route otherwise)."""
    paths = client.get("/openapi.json").json()["paths"]
    openai = (("/v1/chat/completions", "post"), ("/v1/completions", "post"), ("/v1/models/{model_id}", "get"))
    for route, method in openai:
        responses = paths[route][method]["responses"]
        assert "422" not in responses and ("400" in responses) == (method == "post"), route
    for route in ("/v1/generate", "/v1/score"):
        responses = paths[route]["post"]["responses"]
        assert "400" not in responses and "ErrorBody" in str(responses["422"]), route
