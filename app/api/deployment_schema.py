"""The OpenAPI schema of this deployment: the limits and names that validation enforces, stated in the schema.

The static schema (from the pydantic models) cannot know the configured limits, the served
model's name or the artifact's calibrated targets; the service can, once it is loaded. This
fills them in, so that every request the schema allows is one the service accepts (up to
the prompt's length in tokens, which no JSON schema can state), and the other way round.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from app.serving.policy import default_method, policy_choices
from app.serving.runtime import Runtime, ServingArtifact, State
from app.uncertainty.methods import Method


def _maximum(field: dict[str, Any], value: int) -> None:
    """Set the maximum of an integer field (plain, or one branch of an optional)."""
    for branch in [field, *field.get("anyOf", [])]:
        if branch.get("type") == "integer":
            branch["maximum"] = value


def _max_items(field: dict[str, Any], value: int) -> None:
    for branch in field.get("anyOf", []):
        if branch.get("type") == "array":
            branch["maxItems"] = value


def _targets_by_method(runtime: Runtime) -> dict[str, list[str]]:
    artifact = runtime.artifact
    if artifact is None:
        return {}
    manifest = artifact.manifest
    result = {}
    for method, entries in manifest.thresholds.items():
        names = sorted(entries)
        if manifest.default_target in entries:
            names.append("default")
        result[Method(method).value] = names
    return result


def _policy_choices(runtime: Runtime) -> list[dict[str, Any]]:
    """Which (method, target) pairs resolve: no target; a target the named (or default) method calibrated."""
    targets = _targets_by_method(runtime)
    default_name = default_method(runtime.settings, runtime.artifact).value
    choices: list[dict[str, Any]] = [{"properties": {"target": {"type": "null"}}}]
    for method, names in targets.items():
        choices.append(
            {
                "required": ["method", "target"],
                "properties": {"method": {"const": method}, "target": {"enum": names}},
            }
        )
    if targets.get(default_name):
        choices.append(
            {"properties": {"method": {"type": "null"}, "target": {"enum": targets[default_name]}}},
        )
    return choices


def _fill_in(schema: dict[str, Any], runtime: Runtime) -> None:
    settings = runtime.settings
    components = schema["components"]["schemas"]
    native = components["GenerateRequest"]["properties"]
    chat = components["ChatCompletionRequest"]["properties"]
    completion = components["CompletionRequest"]["properties"]
    for field in (
        native["max_new_tokens"],
        chat["max_tokens"],
        chat["max_completion_tokens"],
        completion["max_tokens"],
    ):
        _maximum(field, settings.max_new_tokens_limit)
    for field in (native["stop"], chat["stop"], completion["stop"]):
        _max_items(field, settings.max_stop_strings)
    _maximum(chat["top_logprobs"], settings.max_top_logprobs)
    _maximum(native["top_logprobs"], settings.max_top_logprobs)
    _maximum(completion["logprobs"], settings.max_top_logprobs)
    for field in (chat["model"], completion["model"]):
        field["enum"] = [runtime.model_name]
    _fill_in_policy(components, runtime)


def _fill_in_policy(components: dict[str, Any], runtime: Runtime) -> None:
    """What a request's policy override may say here: nothing at all where the service's policy is binding."""
    settings = runtime.settings
    if not settings.policy_overrides:
        binding = {"type": "null", "description": "not accepted here: this service's reject policy is binding"}
        for request in ("GenerateRequest", "ScoreRequest", "TadOptions"):
            components[request]["properties"]["policy"] = dict(binding)
        return
    choices = policy_choices(settings, runtime.artifact)
    components["Method"]["enum"] = [m.value for m in Method if m not in choices.refused]
    override = components["PolicyOverride"]
    override["anyOf"] = _policy_choices(runtime)
    refusals = [override.pop("not")] if "not" in override else []
    if choices.need_threshold:
        refusals.append(
            {
                "required": ["method"],
                "properties": {
                    "method": {"enum": [m.value for m in choices.need_threshold]},
                    "threshold": {"type": "null"},
                    "target": {"type": "null"},
                },
            }
        )
    if choices.threshold_needs_method:
        refusals.append(
            {"required": ["threshold"], "properties": {"threshold": {"type": "number"}, "method": {"type": "null"}}}
        )
    override["allOf"] = [{"not": refusal} for refusal in refusals]


def _drop_security(schema: dict[str, Any]) -> None:
    """Without TAD_API_KEY nothing asks for a key: the schema must not say that routes need one."""
    schema.get("components", {}).pop("securitySchemes", None)
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            operation.pop("security", None)


def _drop_fastapi_422(schema: dict[str, Any]) -> None:
    """FastAPI declares a 422 of its own shape (`HTTPValidationError`) on every route with parameters that
    declares none. This service never sends it: its validation errors have the one error shape, declared by
    each route with the status its API uses (422 natively, 400 on OpenAI's routes)."""
    own = "#/components/schemas/HTTPValidationError"
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if own in json.dumps(responses.get("422", {})):
                del responses["422"]
    components = schema.get("components", {}).get("schemas", {})
    if "HTTPValidationError" in components and own not in json.dumps(schema):
        components.pop("HTTPValidationError")
        components.pop("ValidationError", None)


def deployment_openapi(app: FastAPI, runtime: Runtime) -> Callable[[], dict[str, Any]]:
    """`app.openapi`: the schema with this deployment's limits; cached once the model is loaded, and
    built again after an artifact reload (calibrated targets come from the artifact)."""
    built_for: dict[str, ServingArtifact] = {}

    def build() -> dict[str, Any]:
        if app.openapi_schema is not None and built_for.get("serving") is runtime.serving:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title,
            version=app.version,
            openapi_version=app.openapi_version,
            description=app.description,
            routes=app.routes,
            separate_input_output_schemas=app.separate_input_output_schemas,
        )
        _drop_fastapi_422(schema)
        if runtime.settings.api_key is None:
            _drop_security(schema)
        if runtime.state is State.READY:
            serving = runtime.serving
            _fill_in(schema, runtime)
            app.openapi_schema = schema
            built_for["serving"] = serving
        return schema

    return build
