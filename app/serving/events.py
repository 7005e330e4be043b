"""What the scheduler's worker sends back to a waiting request (through its asyncio queue)."""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.sequence import SequenceState
from app.errors import ServiceError
from app.uncertainty.answer import ScoredAnswer


@dataclass(frozen=True)
class StreamedToken:
    """One token of a stream; `text` is what it adds to the answer (pieces concatenate to the final text)."""

    index: int
    token_id: int
    text: str
    logprob: float
    entropy: float
    confidence: float | None
    top_logprobs: tuple[tuple[int, float], ...]
    # What TAD reads of this token's attention (FeatureSpec.lag_attention), when the request asked for it.
    attention: tuple[float | None, ...] | None = None


@dataclass(frozen=True)
class Timing:
    queued_s: float
    first_token_s: float | None
    total_s: float


@dataclass(frozen=True)
class GenerationResult:
    sequence: SequenceState
    scored: ScoredAnswer
    timing: Timing


@dataclass(frozen=True)
class Failure:
    error: ServiceError


@dataclass(frozen=True)
class KeepAlive:
    """Nothing to send for a while (queued, or tokens held until the decision): a stream says it is alive."""


Event = StreamedToken | GenerationResult | Failure | ScoredAnswer
