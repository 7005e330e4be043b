"""Native routes: /v1/generate (JSON or server-sent events) and /v1/score."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from app.api.responses import V1_ERRORS, client_gone, json_text, streamed
from app.deps import ApiKeyDep, RuntimeDep
from app.errors import ServiceError, error_body
from app.schemas import GenerateRequest, GenerateResponse, ScoreRequest, ScoreResponse, Usage
from app.serving.generation import ClientDisconnected, GenerationService, finish_reason_text
from app.serving.policy import Decision, resolve_policy
from app.serving.scheduler import GenerationResult, StreamedToken

router = APIRouter(prefix="/v1", tags=["generation"], dependencies=[ApiKeyDep])

STREAM_DOC = streamed(
    "The answer with its uncertainty and decision; with `stream: true`, server-sent events: `token` events "
    "(one per token, once its TAD confidence is known; see the README) and a last `final` event holding this "
    "object (or an `error` event)."
)


def sse(event: str, data: object) -> str:
    return f"event: {event}\ndata: {json_text(data)}\n\n"


def _response(
    service: GenerationService, result: GenerationResult, decision: Decision, body: GenerateRequest, seed: int | None
) -> GenerateResponse:
    scored = result.scored
    return GenerateResponse(
        text=result.sequence.text,
        finish_reason=finish_reason_text(result.sequence.finish_reason),  # type: ignore[arg-type]
        tokens=service.token_infos(scored) if body.return_tokens else None,
        uncertainty=service.sequence_scores(scored),
        decision=service.decision_info(decision),
        usage=Usage(prompt_tokens=len(result.sequence.request.prompt_ids), completion_tokens=len(scored.trace)),
        model=service.runtime.model_name,
        artifact=service.runtime.artifact.name if service.runtime.artifact else None,
        tad_available=service.runtime.artifact is not None,
        seed=seed,
    )


@router.post(
    "/generate",
    response_model=GenerateResponse,
    responses={200: STREAM_DOC, **V1_ERRORS},
    summary="Generate, with per-token and sequence uncertainty and an accept/reject decision",
)
async def generate(
    body: GenerateRequest, request: Request, runtime: RuntimeDep
) -> GenerateResponse | StreamingResponse:
    service = GenerationService(runtime)
    prepared = service.prepare(
        body.prompt,
        body.messages,
        max_new_tokens=body.max_new_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stop,  # type: ignore[arg-type]
        policy=body.policy,
    )
    item = service.submit(prepared, stream=body.stream, early_stop=body.early_stop)
    if not body.stream:
        finished = await service.finish(item, request)
        return client_gone() if finished is None else _response(service, *finished, body, prepared.seed)

    async def events() -> AsyncIterator[str]:
        try:
            async for event in service.stream(item, None):
                if isinstance(event, StreamedToken):
                    yield sse("token", service.streamed_token(event))
                else:
                    final = _response(service, event, service.conclude(item, event), body, prepared.seed)
                    yield sse("final", final.model_dump(mode="json"))
        except ServiceError as error:
            yield sse("error", error_body(error.status_code, error.error_type, error.message, error.param))

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.post(
    "/score",
    response_model=ScoreResponse,
    responses=V1_ERRORS,
    summary="Uncertainty and decision for a given answer (one teacher-forced pass)",
)
async def score(body: ScoreRequest, request: Request, runtime: RuntimeDep) -> ScoreResponse:
    service = GenerationService(runtime)
    prompt_ids = service.encode(body.prompt, body.messages)
    policy = resolve_policy(runtime.settings, runtime.artifact, body.policy)
    try:
        scored = await service.score(prompt_ids, body.response, request)
    except ClientDisconnected:
        return client_gone()  # type: ignore[return-value]
    decision = service.decide(policy, scored)
    return ScoreResponse(
        tokens=service.token_infos(scored) if body.return_tokens else None,
        uncertainty=service.sequence_scores(scored),
        decision=service.decision_info(decision),
        usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=len(scored.trace)),
        model=service.runtime.model_name,
        artifact=runtime.artifact.name if runtime.artifact else None,
        tad_available=runtime.artifact is not None,
    )
