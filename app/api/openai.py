"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from app.api.openai_protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from app.api.responses import V1_ERRORS, client_gone, errors, json_text, streamed
from app.deps import ApiKeyDep, RuntimeDep
from app.errors import ServiceError, error_body
from app.schemas import ChatMessage
from app.serving.generation import GenerationService
from app.serving.openai_format import ChunkWriter, chat_response, completion_response
from app.serving.policy import Decision
from app.serving.scheduler import GenerationResult, StreamedToken

router = APIRouter(prefix="/v1", tags=["openai"], dependencies=[ApiKeyDep])

OPENAI_ERRORS = {**V1_ERRORS, **errors(404)}
STREAM_DOC = streamed("The completion; with `stream: true`, server-sent `data:` chunks ending with `data: [DONE]`.")


class ModelNotFound(ServiceError):
    status_code = 404
    error_type = "model_not_found"


def _check_model(service: GenerationService, requested: str) -> str:
    served = service.runtime.model_name
    if requested != served:
        raise ModelNotFound(f"model '{requested}' is not served here; this server serves '{served}'", param="model")
    return served


def _data(payload: object) -> str:
    return f"data: {json_text(payload)}\n\n"


async def _run(
    service: GenerationService,
    request: Request,
    body: ChatCompletionRequest | CompletionRequest,
    prompt: str | None,
    messages: list[ChatMessage] | None,
    max_tokens: int | None,
    top_logprobs: int,
    writer: ChunkWriter,
    respond: Callable[[GenerationResult, Decision], BaseModel],
) -> BaseModel | Response:
    """Both completion routes: validate, submit, then a JSON answer or a stream of chunks."""
    prepared = service.prepare(
        prompt,
        messages,
        max_new_tokens=max_tokens,
        temperature=body.effective_temperature,
        top_p=body.effective_top_p,
        seed=body.seed,
        stop=body.stop,  # type: ignore[arg-type]
        top_logprobs=top_logprobs,
        policy=body.tad.policy if body.tad else None,
        max_tokens_field="max_tokens",
    )
    item = service.submit(prepared, stream=body.stream, early_stop=bool(body.tad and body.tad.early_stop))
    if not body.stream:
        finished = await service.finish(item, request)
        return client_gone() if finished is None else respond(*finished)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def chunks() -> AsyncIterator[str]:
        opening = writer.opening()
        if opening is not None:
            yield _data(opening)
        try:
            async for event in service.stream(item, None):
                if isinstance(event, StreamedToken):
                    yield _data(writer.token(event))
                else:
                    yield _data(writer.closing(event, service.conclude(item, event)))
                    if include_usage:
                        yield _data(writer.usage(event))
        except ServiceError as error:
            yield _data(error_body(error.status_code, error.error_type, error.message, error.param))
        yield "data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.post(
    "/chat/completions",
    response_model=ChatCompletionResponse,
    responses={200: STREAM_DOC, **OPENAI_ERRORS},
    summary="OpenAI-compatible chat completion, with an `uncertainty` extension",
)
async def chat_completions(body: ChatCompletionRequest, request: Request, runtime: RuntimeDep) -> Any:
    service = GenerationService(runtime)
    model = _check_model(service, body.model)
    messages = [
        ChatMessage(role="system" if m.role == "developer" else m.role, content=m.text()) for m in body.messages
    ]
    return await _run(
        service,
        request,
        body,
        None,
        messages,
        body.max_completion_tokens or body.max_tokens,
        body.top_logprobs or 0,
        ChunkWriter(service, model, chat=True, logprobs=body.logprobs),
        lambda result, decision: chat_response(service, result, decision, model, body.logprobs),
    )


@router.post(
    "/completions",
    response_model=CompletionResponse,
    responses={200: STREAM_DOC, **OPENAI_ERRORS},
    summary="OpenAI-compatible text completion (raw prompt), with an `uncertainty` extension",
)
async def completions(body: CompletionRequest, request: Request, runtime: RuntimeDep) -> Any:
    service = GenerationService(runtime)
    model = _check_model(service, body.model)
    return await _run(
        service,
        request,
        body,
        str(body.prompt),
        None,
        body.max_tokens,
        body.logprobs or 0,
        ChunkWriter(service, model, chat=False, logprobs=body.logprobs is not None),
        lambda result, decision: completion_response(service, result, decision, model, body.logprobs),
    )


@router.get("/models", response_model=ModelList, responses=errors(401, 503), summary="The served model")
async def models(runtime: RuntimeDep) -> ModelList:
    runtime.require_ready()
    return ModelList(data=[ModelCard(id=runtime.model_name, created=int(runtime.started_at))])
