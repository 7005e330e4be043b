"""Domain outcomes to the native API's shapes: JSON responses and server-sent events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.api.common import DecisionInfo, TokenConfidence, TokenToBytes, TokenToText, sequence_scores
from app.api.native.protocol import GenerateResponse, ScoreResponse, TokenEvent, TokenInfo, TopLogprob, Usage
from app.api.streaming import sse_event
from app.errors import ServiceError, error_body
from app.numeric import logprob_or_floor
from app.serving.events import StreamedToken
from app.serving.outcomes import GenerationOutcome, ScoreOutcome
from app.uncertainty.answer import ScoredAnswer
from app.uncertainty.features import FeatureSpec

Alternatives = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class TokenDetail:
    """How to spell tokens, and the optional per-token extras a request asked for."""

    text: TokenToText
    bytes: TokenToBytes
    top_logprobs: bool = False
    attention: FeatureSpec | None = None  # the artifact's feature spec when attention was asked for


def _top(detail: TokenDetail, alternatives: Alternatives) -> list[TopLogprob] | None:
    if not detail.top_logprobs:
        return None
    return [
        TopLogprob(id=i, text=detail.text(i), bytes=list(detail.bytes(i)), logprob=logprob_or_floor(lp))
        for i, lp in alternatives
    ]


def token_infos(
    scored: ScoredAnswer, detail: TokenDetail, alternatives: Sequence[Alternatives] = ()
) -> list[TokenInfo]:
    """`alternatives[i]`: token i's top log-probabilities (a generated answer; a scored one has none)."""
    trace, confidences = scored.trace, scored.confidences
    rows = trace.attention if detail.attention is not None else None
    return [
        TokenInfo(
            id=token_id,
            text=detail.text(token_id),
            bytes=list(detail.bytes(token_id)),
            logprob=logprob_or_floor(float(trace.logprobs[index])),
            entropy=float(trace.entropies[index]),
            top_logprobs=_top(detail, alternatives[index] if index < len(alternatives) else ()),
            attention=detail.attention.lag_attention(rows, index) if detail.attention and rows is not None else None,
            **TokenConfidence.fields(float(confidences[index]) if confidences is not None else None),
        )
        for index, token_id in enumerate(trace.token_ids)
    ]


def _scored_fields(
    scored: ScoredAnswer,
    outcome: GenerationOutcome | ScoreOutcome,
    tokens: TokenDetail | None,
    alternatives: Sequence[Alternatives] = (),
) -> dict[str, object]:
    served = outcome.served
    return {
        "tokens": token_infos(scored, tokens, alternatives) if tokens is not None else None,
        "uncertainty": sequence_scores(scored.sequence),
        "decision": DecisionInfo.of(outcome.decision),
        "usage": Usage(prompt_tokens=outcome.prompt_tokens, completion_tokens=outcome.completion_tokens),
        "model": served.model,
        "artifact": served.artifact,
        "tad_available": served.tad_available,
    }


def score_response(outcome: ScoreOutcome, tokens: TokenDetail | None) -> ScoreResponse:
    """`tokens`: how to spell a token and what to add to each, or None to leave the per-token list out."""
    return ScoreResponse(**_scored_fields(outcome.scored, outcome, tokens))


def generate_response(outcome: GenerationOutcome, tokens: TokenDetail | None) -> GenerateResponse:
    sequence = outcome.result.sequence
    alternatives = [token.top_logprobs for token in sequence.kept_tokens]
    if outcome.withheld:
        tokens = None  # they spell the answer
    return GenerateResponse(
        text=outcome.text,
        finish_reason=sequence.finish_reason.reported if sequence.finish_reason else "stop",
        seed=outcome.seed,
        **_scored_fields(outcome.scored, outcome, tokens, alternatives),
    )


class NativeStreamEncoder:
    """`token` events, then one `final` event holding the whole response (or an `error` event).

    Token events carry the same per-token fields as the final response's tokens, whatever
    `return_tokens` says (it only drops the list from the final event).
    """

    def __init__(self, detail: TokenDetail, return_tokens: bool) -> None:
        self.detail = detail
        self.return_tokens = return_tokens

    def opening(self) -> list[str]:
        return []

    def token(self, event: StreamedToken) -> list[str]:
        payload = TokenEvent(
            index=event.index,
            id=event.token_id,
            text=event.text,
            bytes=list(self.detail.bytes(event.token_id)),
            logprob=logprob_or_floor(event.logprob),
            entropy=event.entropy,
            top_logprobs=_top(self.detail, event.top_logprobs),
            attention=list(event.attention) if event.attention is not None else None,
            **TokenConfidence.fields(event.confidence),
        )
        return [sse_event("token", payload.model_dump(mode="json"))]

    def final(self, outcome: GenerationOutcome) -> list[str]:
        response = generate_response(outcome, self.detail if self.return_tokens else None)
        return [sse_event("final", response.model_dump(mode="json"))]

    def error(self, error: ServiceError) -> list[str]:
        return [sse_event("error", error_body(error.status_code, error.error_type, error.message, error.param))]

    def done(self) -> list[str]:
        return []
