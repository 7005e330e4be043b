"""What happens to one answer between decode steps: token confidences, streamed pieces, early stop.

Runs on the scheduler's worker thread: after every step for a stream or an early stop (so an early
stop takes effect before the next step), only once the sequence finishes for a whole answer without
one. The scheduler only batches; everything a request wants to know about its answer as it grows is
decided here.
"""

from __future__ import annotations

import numpy as np

from app.engine.engine import Engine
from app.engine.sequence import FinishReason, SequenceState, trace_of
from app.serving.events import Event, GenerationResult, StreamedToken, Timing
from app.serving.policy import EARLY_STOP_MIN_TOKENS, Policy
from app.uncertainty.answer import AnswerScorer
from app.uncertainty.methods import REGISTRY, MethodInput
from app.uncertainty.tad import TadStream


class AnswerProgress:
    """The scheduler's observer of one generation request."""

    def __init__(
        self,
        engine: Engine,
        scorer: AnswerScorer,
        policy: Policy,
        stream_tokens: bool,
        early_stop: bool,
        attention: bool = False,
    ) -> None:
        self.engine = engine
        self.scorer = scorer
        self.policy = policy
        self.stream_tokens = stream_tokens
        self.attention = attention
        self.early_stop = early_stop and policy.threshold is not None
        wants_confidences = stream_tokens or (self.early_stop and policy.needs_regressor)
        self.tad_stream = scorer.stream() if wants_confidences else None
        self.detokenizer = engine.stream_detokenizer() if stream_tokens else None
        # Fixed for the answer's life: a whole answer without early stop has nothing to do between steps.
        self.needs_steps = stream_tokens or self.early_stop

    def tad_pending(self, sequence: SequenceState) -> tuple[TadStream, int, list[np.ndarray]] | None:
        """What the next `on_step` will hand TAD's stream (the stream, the number of log-probs, the step
        rows), so that the scheduler can prime one step's streams together (`prime_streams`); None
        without a stream."""
        if self.tad_stream is None:
            return None
        return self.tad_stream, len(sequence.tokens), sequence.attention_rows

    def on_step(self, sequence: SequenceState) -> list[Event]:
        """Tokens that can be sent now; cuts the answer off if the policy says so."""
        confidences: list[float] | None = None
        if self.tad_stream is not None:
            self.tad_stream.advance(sequence.logprobs(), sequence.attention_rows)
            confidences = self.tad_stream.confidences
        events: list[Event] = []
        if self.detokenizer is not None and not sequence.abandoned:
            known = len(confidences) if confidences is not None else len(sequence.tokens)
            for index, piece in self.detokenizer.ready(sequence, known):
                token = sequence.tokens[index]
                events.append(
                    StreamedToken(
                        index=index,
                        token_id=token.token_id,
                        text=piece,
                        logprob=token.logprob,
                        entropy=token.entropy,
                        confidence=confidences[index] if confidences is not None else None,
                        top_logprobs=token.top_logprobs,
                        attention=self._attention(sequence, index),
                    )
                )
        if self.early_stop and not sequence.finished:
            self._maybe_stop_early(sequence, confidences)
        return events

    def _attention(self, sequence: SequenceState, index: int) -> tuple[float | None, ...] | None:
        """The token's attention as TAD reads it; a streamed token's row is already there (it has its confidence)."""
        if not self.attention or self.tad_stream is None:
            return None
        lags = self.tad_stream.tad.spec.lag_attention(sequence.attention_rows, index)
        return None if lags is None else tuple(lags)

    def _maybe_stop_early(self, sequence: SequenceState, confidences: list[float] | None) -> None:
        method = REGISTRY[self.policy.method.value]
        if method.needs_regressor and confidences is None:
            return
        scored = len(confidences) if method.needs_regressor and confidences is not None else len(sequence.tokens)
        if scored < EARLY_STOP_MIN_TOKENS:
            return
        trace = trace_of(sequence).prefix(scored)
        answer = MethodInput(
            trace=trace,
            tad_confidences=None if confidences is None else np.asarray(confidences[:scored]),
            tad_aggregation=self.scorer.aggregation,
        )
        if self.policy.stops_early(method(answer), scored):
            sequence.finish(FinishReason.UNCERTAINTY, n_kept=scored)

    def on_finish(self, sequence: SequenceState, timing: Timing) -> list[Event]:
        """The last tokens of a stream, then the scored result."""
        events = self.on_step(sequence)
        trace = self.engine.trace(sequence)
        # A streamed answer's confidences are already known: what scoring it again gives, up to float
        # rounding (the same code over the tokens scored together).
        known = self.tad_stream.confidences if self.tad_stream is not None else []
        confidences = np.asarray(known[: len(trace)], dtype=np.float64) if len(known) >= len(trace) > 0 else None
        scored = self.scorer.score(trace, confidences)
        return [*events, GenerationResult(sequence=sequence, scored=scored, timing=timing)]
