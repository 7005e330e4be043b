"""Domain outcomes to OpenAI-shaped responses and stream chunks."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from typing import Any

from app.api.common import DecisionInfo, TokenConfidence, TokenToBytes, sequence_scores
from app.api.openai.protocol import (
    ChatChoice,
    ChatCompletionResponse,
    ChatMessageOut,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    IndexedConfidence,
    TokenLogprob,
    TopLogprob,
    UncertaintyExtension,
    UsageInfo,
)
from app.api.streaming import sse_data
from app.engine.sequence import FinishReason, SequenceState
from app.engine.token_bytes import token_text
from app.errors import ServiceError, error_body
from app.numeric import logprob_or_floor
from app.serving.events import StreamedToken
from app.serving.outcomes import GenerationOutcome, ServedModel


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def openai_finish_reason(outcome: GenerationOutcome) -> str:
    """OpenAI's stop and length; an early stop on uncertainty is reported as stop (the extension says
    which); a withheld answer as content_filter, OpenAI's reason for content left out by the server."""
    if outcome.withheld:
        return "content_filter"
    return "length" if outcome.result.sequence.finish_reason is FinishReason.LENGTH else "stop"


def _top(token_bytes: TokenToBytes, alternatives: tuple[tuple[int, float], ...]) -> list[TopLogprob]:
    result = []
    for token_id, logprob in alternatives:
        raw = token_bytes(token_id)
        result.append(TopLogprob(token=token_text(raw), logprob=logprob_or_floor(logprob), bytes=list(raw)))
    return result


def chat_logprob(
    token_bytes: TokenToBytes, token_id: int, logprob: float, alternatives: tuple[tuple[int, float], ...]
) -> TokenLogprob:
    raw = token_bytes(token_id)
    return TokenLogprob(
        token=token_text(raw),
        logprob=logprob_or_floor(logprob),
        bytes=list(raw),
        top_logprobs=_top(token_bytes, alternatives),
    )


def completion_token(raw: bytes) -> str:
    """A token as OpenAI's legacy completions name it: its text, or, where its bytes are only part of a
    character, `bytes:` and the bytes (`bytes:\\xe2\\x80`). These responses have no `bytes` field, and
    their `top_logprobs` are keyed by this name: as U+FFFD, every partial token would be one key."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in raw)


def completion_top(
    token_bytes: TokenToBytes, token_id: int, logprob: float, alternatives: tuple[tuple[int, float], ...]
) -> dict[str, float]:
    """The most likely tokens and, as OpenAI's legacy completions promise (up to `logprobs` + 1 entries), the
    sampled one, which a sampled answer may have drawn from outside them (with `logprobs: 0`, it alone).
    Two tokens of one name (the same bytes) keep the likelier's logprob, and the sampled token's name its own."""
    top: dict[str, float] = {}
    for i, lp in alternatives:
        top.setdefault(completion_token(token_bytes(i)), logprob_or_floor(lp))
    top[completion_token(token_bytes(token_id))] = logprob_or_floor(logprob)
    return top


def extension(outcome: GenerationOutcome) -> UncertaintyExtension:
    scored = outcome.scored
    confidences = scored.confidences
    tokens = None
    if not outcome.withheld:  # as the answer's tokens, left out with it
        tokens = [
            IndexedConfidence(index=i, **TokenConfidence.fields(None if confidences is None else float(confidences[i])))
            for i in range(len(scored.trace))
        ]
    reason = outcome.result.sequence.finish_reason
    return UncertaintyExtension(
        sequence=sequence_scores(scored.sequence),
        tokens=tokens,
        decision=DecisionInfo.of(outcome.decision),
        finish_reason=reason.reported if reason else None,
        tad_available=outcome.served.tad_available,
    )


def usage(outcome: GenerationOutcome) -> UsageInfo:
    prompt, completion = outcome.prompt_tokens, outcome.completion_tokens
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def chat_response(outcome: GenerationOutcome, token_bytes: TokenToBytes, logprobs: bool) -> ChatCompletionResponse:
    kept = outcome.result.sequence.kept_tokens
    content = None
    if logprobs and not outcome.withheld:  # a withheld answer's tokens would spell it
        content = [chat_logprob(token_bytes, t.token_id, t.logprob, t.top_logprobs) for t in kept]
    return ChatCompletionResponse(
        id=new_id("chatcmpl"),
        created=now(),
        model=outcome.served.model,
        choices=[
            ChatChoice(
                index=0,
                message=ChatMessageOut(content=outcome.text),
                logprobs=ChoiceLogprobs(content=content) if logprobs else None,
                finish_reason=openai_finish_reason(outcome),
            )
        ],
        usage=usage(outcome),
        uncertainty=extension(outcome),
    )


def text_offsets(pieces: list[str]) -> list[int]:
    """Where each token starts in the answer's text: after the pieces before it, the text a stream sends
    with each token (the tokens of a character split over several share its offset, and a decoder that
    adds or drops spaces is counted as the text has them)."""
    return list(itertools.accumulate((len(piece) for piece in pieces[:-1]), initial=0)) if pieces else []


def completion_response(
    outcome: GenerationOutcome,
    token_bytes: TokenToBytes,
    logprobs: int | None,
    answer_pieces: Callable[[SequenceState], list[str]],
) -> CompletionResponse:
    sequence = outcome.result.sequence
    kept = sequence.kept_tokens
    choice_logprobs = None
    if logprobs is not None and not outcome.withheld:  # a withheld answer's tokens would spell it
        choice_logprobs = CompletionLogprobs(
            tokens=[completion_token(token_bytes(t.token_id)) for t in kept],
            token_logprobs=[logprob_or_floor(t.logprob) for t in kept],
            top_logprobs=[completion_top(token_bytes, t.token_id, t.logprob, t.top_logprobs) for t in kept],
            text_offset=text_offsets(answer_pieces(sequence)),
        )
    return CompletionResponse(
        id=new_id("cmpl"),
        created=now(),
        model=outcome.served.model,
        choices=[
            CompletionChoice(
                index=0,
                text=outcome.text,
                logprobs=choice_logprobs,
                finish_reason=openai_finish_reason(outcome),
            )
        ],
        usage=usage(outcome),
        uncertainty=extension(outcome),
    )


class OpenAIStreamEncoder:
    """The `data:` chunks of one chat or text completion, ending with `data: [DONE]`."""

    def __init__(
        self, served: ServedModel, token_bytes: TokenToBytes, chat: bool, logprobs: int | None, include_usage: bool
    ) -> None:
        """`logprobs`: chat, 1 to send them (their alternatives as the request asked); completions, the
        number of alternatives to send (0: the chosen tokens only), None for none."""
        self.served = served
        self.token_bytes = token_bytes
        self.chat = chat
        self.logprobs = logprobs
        self.include_usage = include_usage
        self.id = new_id("chatcmpl" if chat else "cmpl")
        self.created = now()
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self.offset = 0  # characters streamed so far (completions' text_offset)

    def _chunk(self, choice: dict[str, Any] | None, **extra: Any) -> str:
        # With include_usage every chunk has the field, null until the last one's, as OpenAI sends them.
        usage_field = {"usage": None} if self.include_usage else {}
        return sse_data(
            {
                "id": self.id,
                "object": self.object,
                "created": self.created,
                "model": self.served.model,
                "choices": [choice] if choice is not None else [],
                **usage_field,
                **extra,
            }
        )

    def opening(self) -> list[str]:
        if not self.chat:
            return []
        return [
            self._chunk(
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            )
        ]

    def token(self, event: StreamedToken) -> list[str]:
        text = event.text
        confidence = {"index": event.index, **TokenConfidence.fields(event.confidence)}
        logprobs: dict[str, Any] | None
        if self.chat:
            logprobs = None
            if self.logprobs:
                entry = chat_logprob(self.token_bytes, event.token_id, event.logprob, event.top_logprobs)
                logprobs = {"content": [entry.model_dump()]}
            choice = {"index": 0, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}
        else:
            logprobs = (
                {
                    "tokens": [completion_token(self.token_bytes(event.token_id))],
                    "token_logprobs": [logprob_or_floor(event.logprob)],
                    "top_logprobs": [
                        completion_top(self.token_bytes, event.token_id, event.logprob, event.top_logprobs)
                    ],
                    "text_offset": [self.offset],
                }
                if self.logprobs is not None
                else None
            )
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": None}
        self.offset += len(text)
        return [self._chunk(choice, uncertainty={"token": confidence})]

    def _text_choice(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        if self.chat:
            piece: dict[str, Any] = {"delta": {"content": text} if text else {}}
        else:
            piece = {"text": text}
        return {"index": 0, **piece, "logprobs": None, "finish_reason": finish_reason}

    def final(self, outcome: GenerationOutcome) -> list[str]:
        # A withheld answer sent no tokens: its one piece of text is the withheld message.
        chunks = [self._chunk(self._text_choice(outcome.text, None))] if outcome.withheld else []
        ext = extension(outcome).model_dump(mode="json")
        ext.pop("tokens", None)
        ext["text"] = outcome.text
        chunks.append(self._chunk(self._text_choice("", openai_finish_reason(outcome)), uncertainty=ext))
        if self.include_usage:
            chunks.append(self._chunk(None, usage=usage(outcome).model_dump()))
        return chunks

    def error(self, error: ServiceError) -> list[str]:
        return [sse_data(error_body(error.status_code, error.error_type, error.message, error.param))]

    def done(self) -> list[str]:
        return ["data: [DONE]\n\n"]
