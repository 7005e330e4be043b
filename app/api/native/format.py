"""Domain outcomes to the native API's shapes: JSON responses and server-sent events."""

from __future__ import annotations

from collections.abc import Callable

from app.api.common import DecisionInfo, TokenConfidence, sequence_scores
from app.api.native.protocol import GenerateResponse, ScoreResponse, TokenEvent, TokenInfo, Usage
from app.api.streaming import sse_event
from app.errors import ServiceError, error_body
from app.serving.events import StreamedToken
from app.serving.service import GenerationOutcome, ScoreOutcome, ServedModel
from app.uncertainty.answer import ScoredAnswer

TokenText = Callable[[int], str]


def token_infos(scored: ScoredAnswer, token_text: TokenText) -> list[TokenInfo]:
    trace, confidences = scored.trace, scored.confidences
    return [
        TokenInfo(
            id=token_id,
            text=token_text(token_id),
            logprob=float(trace.logprobs[index]),
            entropy=float(trace.entropies[index]),
            **TokenConfidence.fields(float(confidences[index]) if confidences is not None else None),
        )
        for index, token_id in enumerate(trace.token_ids)
    ]


def _scored_fields(
    scored: ScoredAnswer, outcome: GenerationOutcome | ScoreOutcome, served: ServedModel, tokens: TokenText | None
) -> dict[str, object]:
    return {
        "tokens": token_infos(scored, tokens) if tokens is not None else None,
        "uncertainty": sequence_scores(scored.sequence),
        "decision": DecisionInfo.of(outcome.decision),
        "usage": Usage(prompt_tokens=outcome.prompt_tokens, completion_tokens=len(scored.trace)),
        "model": served.model,
        "artifact": served.artifact,
        "tad_available": served.tad_available,
    }


def score_response(outcome: ScoreOutcome, served: ServedModel, tokens: TokenText | None) -> ScoreResponse:
    """`tokens`: how to spell a token, or None to leave the per-token list out."""
    return ScoreResponse(**_scored_fields(outcome.scored, outcome, served, tokens))  # type: ignore[arg-type]


def generate_response(outcome: GenerationOutcome, served: ServedModel, tokens: TokenText | None) -> GenerateResponse:
    sequence = outcome.result.sequence
    return GenerateResponse(
        text=sequence.text,
        finish_reason=sequence.finish_reason.reported if sequence.finish_reason else "stop",  # type: ignore[arg-type]
        seed=outcome.seed,
        **_scored_fields(outcome.scored, outcome, served, tokens),  # type: ignore[arg-type]
    )


class NativeStreamEncoder:
    """`token` events, then one `final` event holding the whole response (or an `error` event)."""

    def __init__(self, served: ServedModel, tokens: TokenText | None) -> None:
        self.served = served
        self.tokens = tokens

    def opening(self) -> list[str]:
        return []

    def token(self, event: StreamedToken) -> list[str]:
        payload = TokenEvent(
            index=event.index,
            id=event.token_id,
            text=event.text,
            logprob=event.logprob,
            entropy=event.entropy,
            **TokenConfidence.fields(event.confidence),
        )
        return [sse_event("token", payload.model_dump(mode="json"))]

    def final(self, outcome: GenerationOutcome) -> list[str]:
        return [sse_event("final", generate_response(outcome, self.served, self.tokens).model_dump(mode="json"))]

    def error(self, error: ServiceError) -> list[str]:
        return [sse_event("error", error_body(error.status_code, error.error_type, error.message, error.param))]

    def done(self) -> list[str]:
        return []
