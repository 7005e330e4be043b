"""Operational routes: liveness, readiness, metrics, info."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from app import __version__
from app.api.deps import ApiKeyDep, RuntimeDep
from app.api.openapi import errors
from app.api.ops.protocol import ArtifactReloadResponse, HealthResponse, InfoResponse, ReadyResponse
from app.engine.engine import Engine
from app.errors import Conflict, Forbidden, NotReady
from app.serving.context_room import context_length
from app.serving.policy import configured_target
from app.serving.runtime import ArtifactReloadError, Runtime, State

router = APIRouter(tags=["operations"])


@router.get(
    "/health",
    response_model=HealthResponse,
    responses=errors(503),
    summary="The process is alive (503 once only a restart can bring it back)",
)
async def health(runtime: RuntimeDep) -> HealthResponse:
    reason = runtime.needs_restart
    if reason is not None:
        raise NotReady(f"{reason}; restart this replica", retry_after_s=60)
    return HealthResponse(status="ok")


@router.get(
    "/ready",
    response_model=ReadyResponse,
    responses=errors(503),
    summary="Model and artifact loaded, worker healthy (503 before, while shutting down, once the worker is broken)",
)
async def ready(runtime: RuntimeDep) -> ReadyResponse:
    if runtime.state is State.FAILED:
        # Unauthenticated: the reason (paths, a loader's own words) is for the operator, in the log.
        raise NotReady("startup failed; the server's log says why", retry_after_s=60)
    runtime.require_ready()
    return ReadyResponse(
        status="ready", model=runtime.model_name, artifact=runtime.artifact.name if runtime.artifact else None
    )


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(runtime: RuntimeDep) -> Response:
    if runtime.scheduler is not None:
        runtime.metrics.queue_depth.set(runtime.scheduler.stats.queue_depth)
        runtime.metrics.running_requests.set(runtime.scheduler.stats.running)
    runtime.refresh_ready_gauge()  # a scrape sees the state now, whether or not anything asked /ready since
    body, content_type = runtime.metrics.exposition()
    return Response(content=body, media_type=content_type)


def _decode_step(engine: Engine) -> dict[str, Any]:
    why_eager = engine.compiled_decode_refusal()
    compiled = why_eager is None
    return {
        "mode": "compiled" if compiled else "eager",
        "slot_length": engine.compiled_decode_length if compiled else None,
        "why_eager": why_eager,
    }


def _artifact_summary(runtime: Runtime) -> dict[str, Any] | None:
    artifact = runtime.artifact
    if artifact is None:
        return None
    manifest = artifact.manifest
    return {
        "path": str(artifact.path),
        "name": artifact.name,
        "created_at": manifest.created_at,
        "llm": manifest.llm.model_dump(),
        "features": manifest.features.model_dump(),
        "epsilon": manifest.epsilon,
        "aggregation": manifest.aggregation.value if manifest.aggregation is not None else None,
        "variant": manifest.variant,
        "regressor": manifest.regressor.model_dump() if manifest.regressor is not None else None,
        "dtype": manifest.dtype,
        "thresholds": {m.value: {k: v.model_dump() for k, v in t.items()} for m, t in manifest.thresholds.items()},
        "default_target": manifest.default_target,
        "decision_method": artifact.decision_method.value,
        "cv": {k: v for k, v in manifest.metrics.get("cv", {}).items() if k in ("chosen", "best_per_variant")},
        "training": {k: v for k, v in manifest.training.items() if k != "generation"},
        "files": manifest.files,
        "manifest_sha256": runtime.serving.manifest_sha256,
        "loaded_at": runtime.serving.loaded_at,
    }


@router.get(
    "/info",
    response_model=InfoResponse,
    responses=errors(401, 503),
    dependencies=[ApiKeyDep],
    summary="Model, device, artifact, policy (behind the API key when one is set: it names paths)",
)
async def info(runtime: RuntimeDep) -> InfoResponse:
    engine, _ = runtime.require_ready()
    settings = runtime.settings
    policy = runtime.default_policy()
    return InfoResponse(
        model=engine.identity.model_dump(),
        chat_template=engine.has_chat_template,
        architecture=engine.loaded.architecture.as_dict(),
        device=str(engine.device),
        dtype=str(engine.dtype).removeprefix("torch."),
        decode_step=_decode_step(engine),
        tad_available=runtime.tad_unavailable_reason is None,
        tad_unavailable_reason=runtime.tad_unavailable_reason,
        artifact=_artifact_summary(runtime),
        policy={
            **policy.as_dict(),
            "active": policy.threshold is not None,
            "overridable": settings.policy_overrides,
            "reject_target": configured_target(settings, runtime.artifact),
        },
        limits={
            "max_new_tokens": settings.max_new_tokens_limit,
            "default_max_new_tokens": settings.default_max_new_tokens,
            "max_prompt_tokens": settings.max_prompt_tokens,
            # Prompt plus answer: the model's context, or a compiled step's slot (which the limits above may exceed).
            "context_tokens": context_length(engine),
            "max_top_logprobs": settings.max_top_logprobs,
            "max_body_bytes": settings.max_body_bytes,
            "max_batch_size": settings.max_batch_size,
            "max_queue": settings.max_queue,
            "prefill_chunk_tokens": settings.prefill_chunk_tokens,
            "request_timeout_s": settings.request_timeout_s,
        },
        version=__version__,
    )


@router.post(
    "/admin/reload-artifact",
    response_model=ArtifactReloadResponse,
    responses=errors(401, 403, 408, 409, 413, 503),
    dependencies=[ApiKeyDep],
    summary="Load the artifact at TAD_ARTIFACT_DIR again and serve it from the next request on (same as SIGHUP); "
    "requests in flight finish with the one they started with; a refused artifact (409) leaves the old one serving",
)
async def reload_artifact(runtime: RuntimeDep, request: Request) -> ArtifactReloadResponse:
    # A page on any site can POST here from a browser (no preflight for a body-less POST); only a browser sends
    # Origin, and then only origins the deployment lists may.
    origin = request.headers.get("origin")
    if origin is not None and origin not in runtime.settings.cors_origins:
        raise Forbidden(f"origin {origin[:100]!r} may not reload the artifact (TAD_CORS_ORIGINS)", param="Origin")
    runtime.require_ready()
    try:
        # Hashing and unpickling take a moment: off the event loop.
        serving = await run_in_threadpool(runtime.reload_artifact)
    except ArtifactReloadError as error:
        kept = "the previous one keeps serving" if runtime.artifact is not None else "none is served, as before"
        reason = str(error)
        if (folder := runtime.settings.artifact_dir) is not None:  # the folder's name; its full path is logged
            reason = reason.replace(str(folder), folder.name)
        raise Conflict(f"artifact refused, {kept}: {reason}") from error
    return ArtifactReloadResponse(
        artifact=serving.name, manifest_sha256=serving.manifest_sha256, loaded_at=serving.loaded_at
    )
