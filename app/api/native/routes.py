"""Native routes: /v1/generate (JSON or server-sent events) and /v1/score."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.api.common import policy_request
from app.api.deps import ApiKeyDep, ServiceDep
from app.api.errors import client_gone
from app.api.native.format import NativeStreamEncoder, TokenDetail, generate_response, score_response
from app.api.native.protocol import GenerateRequest, GenerateResponse, ScoreRequest, ScoreResponse
from app.api.openapi import V1_ERRORS, streamed
from app.api.streaming import stream_response
from app.serving.runtime import ServingArtifact
from app.serving.service import GenerationService

router = APIRouter(prefix="/v1", tags=["generation"], dependencies=[ApiKeyDep])

STREAM_DOC = streamed(
    "The answer with its uncertainty and decision; with `stream: true`, server-sent events: `token` events "
    "(one per token, once its TAD confidence is known; see docs/api.md, Streaming) and a last `final` event "
    "holding this object (or an `error` event)."
)


@router.post(
    "/generate",
    response_model=GenerateResponse,
    responses={200: STREAM_DOC, **V1_ERRORS},
    summary="Generate, with per-token and sequence uncertainty and an accept/reject decision",
)
async def generate(body: GenerateRequest, request: Request, service: ServiceDep) -> GenerateResponse | Response:
    prepared = await service.prepare(
        body.to_prompt(),
        max_new_tokens=body.max_new_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stop,
        top_logprobs=body.top_logprobs,
        policy=policy_request(body.policy),
    )
    # Before submitting: nothing that can fail may come between submitting and the response that cancels.
    detail = _detail(service, body.return_attention, top_logprobs=body.top_logprobs > 0, serving=prepared.serving)
    submitted = service.submit(
        prepared, stream=body.stream, early_stop=body.early_stop, attention=body.stream and body.return_attention
    )
    if body.stream:
        return stream_response(service, submitted, NativeStreamEncoder(detail, body.return_tokens))
    outcome = await service.finish(submitted, request)
    if outcome is None:
        return client_gone()
    return generate_response(outcome, detail if body.return_tokens else None)


@router.post(
    "/score",
    response_model=ScoreResponse,
    responses=V1_ERRORS,
    summary="Uncertainty and decision for a given answer (one teacher-forced pass)",
)
async def score(body: ScoreRequest, request: Request, service: ServiceDep) -> ScoreResponse | Response:
    outcome = await service.score(body.to_prompt(), body.response, policy_request(body.policy), request)
    if outcome is None:
        return client_gone()
    detail = _detail(service, body.return_attention, top_logprobs=False, serving=outcome.serving)
    return score_response(outcome, detail if body.return_tokens else None)


def _detail(
    service: GenerationService, attention: bool, top_logprobs: bool, serving: ServingArtifact | None = None
) -> TokenDetail:
    """What each token carries; `serving`: the artifact the request started with (it reads the rows)."""
    spec = service.feature_spec(serving) if attention else None
    return TokenDetail(service.token_text, service.token_bytes, top_logprobs=top_logprobs, attention=spec)
