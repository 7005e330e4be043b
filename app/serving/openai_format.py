"""Turning generation results into OpenAI-shaped responses and stream chunks."""

from __future__ import annotations

import time
import uuid
from typing import Any

from app.api.openai_protocol import (
    ChatChoice,
    ChatCompletionResponse,
    ChatMessageOut,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    TokenConfidence,
    TokenLogprob,
    TopLogprob,
    UncertaintyExtension,
    UsageInfo,
    clean_float,
    token_bytes,
)
from app.engine.sequence import FinishReason, TokenRecord
from app.serving.generation import GenerationService, finish_reason_text
from app.serving.policy import Decision
from app.serving.scheduler import GenerationResult, StreamedToken


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def openai_finish_reason(reason: FinishReason | None) -> str:
    """OpenAI knows stop and length; an early stop on uncertainty is reported as stop (see the extension)."""
    return "length" if reason is FinishReason.LENGTH else "stop"


def _top(service: GenerationService, alternatives: tuple[tuple[int, float], ...]) -> list[TopLogprob]:
    result = []
    for token_id, logprob in alternatives:
        text = service.engine.token_text(token_id)
        result.append(TopLogprob(token=text, logprob=clean_float(logprob), bytes=token_bytes(text)))
    return result


def chat_logprob(service: GenerationService, record: TokenRecord) -> TokenLogprob:
    text = service.engine.token_text(record.token_id)
    return TokenLogprob(
        token=text,
        logprob=clean_float(record.logprob),
        bytes=token_bytes(text),
        top_logprobs=_top(service, record.top_logprobs),
    )


def extension(service: GenerationService, result: GenerationResult, decision: Decision) -> UncertaintyExtension:
    scored = result.scored
    confidences = scored.confidences
    tokens = [
        TokenConfidence(
            index=i,
            confidence=None if confidences is None else float(confidences[i]),
            uncertainty=None if confidences is None else 1.0 - float(confidences[i]),
        )
        for i in range(len(scored.trace))
    ]
    return UncertaintyExtension(
        sequence=service.sequence_scores(scored),
        tokens=tokens,
        decision=service.decision_info(decision),
        finish_reason=finish_reason_text(result.sequence.finish_reason),
        tad_available=service.runtime.artifact is not None,
    )


def usage(result: GenerationResult) -> UsageInfo:
    prompt = len(result.sequence.request.prompt_ids)
    completion = len(result.scored.trace)
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def chat_response(
    service: GenerationService, result: GenerationResult, decision: Decision, model: str, logprobs: bool
) -> ChatCompletionResponse:
    kept = result.sequence.kept_tokens
    return ChatCompletionResponse(
        id=new_id("chatcmpl"),
        created=now(),
        model=model,
        choices=[
            ChatChoice(
                index=0,
                message=ChatMessageOut(content=result.sequence.text),
                logprobs=ChoiceLogprobs(content=[chat_logprob(service, t) for t in kept]) if logprobs else None,
                finish_reason=openai_finish_reason(result.sequence.finish_reason),  # type: ignore[arg-type]
            )
        ],
        usage=usage(result),
        uncertainty=extension(service, result, decision),
    )


def completion_response(
    service: GenerationService, result: GenerationResult, decision: Decision, model: str, logprobs: int | None
) -> CompletionResponse:
    kept = result.sequence.kept_tokens
    choice_logprobs = None
    if logprobs is not None:
        texts = [service.engine.token_text(t.token_id) for t in kept]
        offsets, position = [], 0
        for text in texts:
            offsets.append(position)
            position += len(text)
        choice_logprobs = CompletionLogprobs(
            tokens=texts,
            token_logprobs=[clean_float(t.logprob) for t in kept],
            top_logprobs=[{service.engine.token_text(i): clean_float(lp) for i, lp in t.top_logprobs} for t in kept]
            if logprobs > 0
            else None,
            text_offset=offsets,
        )
    return CompletionResponse(
        id=new_id("cmpl"),
        created=now(),
        model=model,
        choices=[
            CompletionChoice(
                index=0,
                text=result.sequence.text,
                logprobs=choice_logprobs,
                finish_reason=openai_finish_reason(result.sequence.finish_reason),  # type: ignore[arg-type]
            )
        ],
        usage=usage(result),
        uncertainty=extension(service, result, decision),
    )


class ChunkWriter:
    """Builds the stream chunks of one chat or text completion."""

    def __init__(self, service: GenerationService, model: str, chat: bool, logprobs: bool) -> None:
        self.service = service
        self.model = model
        self.chat = chat
        self.logprobs = logprobs
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = now()
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self.offset = 0  # characters streamed so far (completions' text_offset)

    def _chunk(self, choice: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [choice] if choice is not None else [],
            **extra,
        }

    def opening(self) -> dict[str, Any] | None:
        if not self.chat:
            return None
        return self._chunk(
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        )

    def token(self, event: StreamedToken) -> dict[str, Any]:
        record = TokenRecord(event.token_id, event.logprob, event.entropy, event.top_logprobs)
        text = event.text
        confidence = {
            "index": event.index,
            "confidence": event.confidence,
            "uncertainty": None if event.confidence is None else 1.0 - event.confidence,
        }
        if self.chat:
            logprobs = {"content": [chat_logprob(self.service, record).model_dump()]} if self.logprobs else None
            choice = {"index": 0, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}
        else:
            logprobs = (
                {
                    "tokens": [self.service.engine.token_text(event.token_id)],
                    "token_logprobs": [clean_float(event.logprob)],
                    "top_logprobs": None,
                    "text_offset": [self.offset],
                }
                if self.logprobs
                else None
            )
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": None}
        self.offset += len(text)
        return self._chunk(choice, uncertainty={"token": confidence})

    def closing(self, result: GenerationResult, decision: Decision) -> dict[str, Any]:
        reason = openai_finish_reason(result.sequence.finish_reason)
        if self.chat:
            choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": reason}
        ext = extension(self.service, result, decision).model_dump(mode="json")
        ext.pop("tokens", None)
        ext["text"] = result.sequence.text
        return self._chunk(choice, uncertainty=ext)

    def usage(self, result: GenerationResult) -> dict[str, Any]:
        return self._chunk(None, usage=usage(result).model_dump())
