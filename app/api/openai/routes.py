"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import re

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute

from app.api.common import policy_request
from app.api.deps import ApiKeyDep, RuntimeDep, ServiceDep
from app.api.errors import client_gone
from app.api.openai.format import OpenAIStreamEncoder, chat_response, completion_response
from app.api.openai.protocol import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    MAX_MODEL_NAME,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    OpenAIMessage,
)
from app.api.openapi import V1_ERRORS, errors, streamed
from app.api.streaming import stream_response
from app.errors import InvalidRequest, ServiceError
from app.serving.outcomes import PromptInput, Submitted
from app.serving.runtime import Runtime
from app.serving.service import GenerationService

# A policy field named in a message (policy.method, policy.threshold ...), not already under `tad.`.
POLICY_FIELD = re.compile(r"(?<![\w.])policy\.(method|threshold|target|action)\b")


class OpenAIRoute(APIRoute):
    """OpenAI's API (and vLLM's) answers an invalid request with a 400, which its clients raise as
    `BadRequestError`; the native routes keep FastAPI's 422 (app/api/errors.py, `invalid_request_status`)."""

    invalid_request_status = 400
    # OpenAI's fields this service does not take, or takes only at the value that asks for nothing: refused as
    # unsupported, not as unknown ("Extra inputs are not permitted" reads like a typo).
    unsupported_fields = frozenset(
        {
            "tools",
            "functions",
            "function_call",
            "tool_choice",
            "response_format.type",
            "modalities",
            "audio",
            "prediction",
            "reasoning_effort",
            "verbosity",
            "service_tier",
            "web_search_options",
            "stream_options.include_obfuscation",
            "suffix",
        }
    )


router = APIRouter(prefix="/v1", tags=["openai"], dependencies=[ApiKeyDep], route_class=OpenAIRoute)

OPENAI_ERRORS = {**{code: body for code, body in V1_ERRORS.items() if code != 422}, **errors(400, 404)}
STREAM_DOC = streamed("The completion; with `stream: true`, server-sent `data:` chunks ending with `data: [DONE]`.")


class ModelNotFound(ServiceError):
    status_code = 404
    error_type = "model_not_found"


def _check_model(service: GenerationService, requested: str) -> None:
    served = service.served.model
    if not service.runtime.serves(requested):
        raise ModelNotFound(f"model '{requested}' is not served here; this server serves '{served}'", param="model")


async def _submit(
    service: GenerationService,
    body: ChatCompletionRequest | CompletionRequest,
    prompt: PromptInput,
    max_tokens: int | None,
    top_logprobs: int,
) -> Submitted:
    _check_model(service, body.model)
    chat = isinstance(body, ChatCompletionRequest)
    try:
        prepared = await service.prepare(
            prompt,
            max_new_tokens=max_tokens,
            temperature=body.effective_temperature,
            top_p=body.effective_top_p,
            seed=body.seed,
            stop=body.stop,
            top_logprobs=top_logprobs,
            policy=policy_request(body.tad.policy if body.tad else None),
            max_tokens_field="max_completion_tokens"
            if isinstance(body, ChatCompletionRequest) and body.max_completion_tokens
            else "max_tokens",
            default_max_new_tokens=None if chat else COMPLETIONS_DEFAULT_MAX_TOKENS,
            top_logprobs_field="top_logprobs" if chat else "logprobs",
        )
    except InvalidRequest as error:
        # The policy override sits inside the `tad` extension here: its fields are named so, in the message too.
        if error.param is not None and error.param.startswith("policy"):
            error.param = f"tad.{error.param}"
        error.message = POLICY_FIELD.sub(r"tad.\g<0>", error.message)
        raise
    early_stop = bool(body.tad and body.tad.early_stop)
    return service.submit(prepared, stream=bool(body.stream), early_stop=early_stop, early_stop_field="tad.early_stop")


def _check_overridden_max_tokens(service: GenerationService, body: ChatCompletionRequest) -> None:
    """Refuse an out-of-range `max_tokens` even where `max_completion_tokens` overrides it.

    The schema states the bound of each field whatever else is sent, and `prepare` checks only the
    field in force: without this, `max_tokens: 513` beside `max_completion_tokens` passed silently.
    (The lower bound of both is pydantic's; only the deployment's upper bound is checked here.)
    """
    limit = service.settings.max_new_tokens_limit
    if body.max_completion_tokens is not None and body.max_tokens is not None and body.max_tokens > limit:
        raise InvalidRequest(f"max_tokens must be between 1 and {limit}", param="max_tokens")


def _encoder(
    service: GenerationService, submitted: Submitted, body: ChatCompletionRequest | CompletionRequest
) -> OpenAIStreamEncoder:
    chat = isinstance(body, ChatCompletionRequest)
    return OpenAIStreamEncoder(
        submitted.served,
        service.token_bytes,
        chat=chat,
        logprobs=int(bool(body.logprobs)) if chat else body.logprobs,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
    )


def chat_message(message: OpenAIMessage) -> dict[str, str]:
    """A message as the chat template reads it; a participant's `name` goes along, for templates that write it
    (as vLLM passes it)."""
    rendered = {"role": "system" if message.role == "developer" else message.role, "content": message.text()}
    return rendered if message.name is None else {**rendered, "name": message.name}


@router.post(
    "/chat/completions",
    response_model=ChatCompletionResponse,
    responses={200: STREAM_DOC, **OPENAI_ERRORS},
    summary="OpenAI-compatible chat completion, with an `uncertainty` extension",
)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, service: ServiceDep
) -> ChatCompletionResponse | Response:
    messages = [chat_message(m) for m in body.messages]
    _check_overridden_max_tokens(service, body)
    max_tokens = body.max_completion_tokens or body.max_tokens
    submitted = await _submit(service, body, PromptInput(messages=messages), max_tokens, body.top_logprobs or 0)
    if body.stream:
        return stream_response(service, submitted, _encoder(service, submitted, body))
    outcome = await service.finish(submitted, request)
    if outcome is None:
        return client_gone()
    return chat_response(outcome, service.token_bytes, bool(body.logprobs))


@router.post(
    "/completions",
    response_model=CompletionResponse,
    responses={200: STREAM_DOC, **OPENAI_ERRORS},
    summary="OpenAI-compatible text completion (raw prompt), with an `uncertainty` extension",
)
async def completions(body: CompletionRequest, request: Request, service: ServiceDep) -> CompletionResponse | Response:
    submitted = await _submit(service, body, PromptInput(prompt=str(body.prompt)), body.max_tokens, body.logprobs or 0)
    if body.stream:
        return stream_response(service, submitted, _encoder(service, submitted, body))
    outcome = await service.finish(submitted, request)
    if outcome is None:
        return client_gone()
    return completion_response(outcome, service.token_bytes, body.logprobs, service.answer_pieces)


@router.get("/models", response_model=ModelList, responses=errors(401, 503), summary="The served model")
async def models(runtime: RuntimeDep) -> ModelList:
    runtime.require_ready()
    return ModelList(data=[_model_card(runtime)])


@router.get(
    "/models/{model_id:path}",
    response_model=ModelCard,
    responses=errors(401, 404, 503),
    summary="The served model, by id (a hub id's slash included)",
)
async def model(model_id: str, runtime: RuntimeDep) -> ModelCard:
    runtime.require_ready()
    if not runtime.serves(model_id):
        shown = model_id if len(model_id) <= MAX_MODEL_NAME else f"{model_id[:MAX_MODEL_NAME]}..."
        raise ModelNotFound(f"model {shown!r} is not served here; GET /v1/models lists the one that is", param="model")
    return _model_card(runtime)


def _model_card(runtime: Runtime) -> ModelCard:
    return ModelCard(id=runtime.model_name, created=int(runtime.started_at))
