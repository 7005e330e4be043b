"""The recurrent TAD scorer: token confidences c_i from the trained stage-2 regressor.

c_1 = p_1; for i >= 2, c_i = clip(C2(z_i), eps, 1), where z_i holds the confidences of
the N tokens before i. Streaming and whole-sequence scoring run the same per-token code,
so a streamed answer gets exactly the confidences of the same answer scored at once.

A linear C2 (ridge, the artifacts' regressor) is applied without building z_i: its weights
are split by what they multiply (`LinearStage2`), so each token costs one dot product over
its step row as captured plus N products with the earlier p's and c's. Building the
2,700-10,000-value vector and casting it was most of the scorer's time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from app.uncertainty.features import FEATURE_DTYPE, FeatureSpec, stage2_feature_row, token_probabilities
from app.uncertainty.trace import TokenTrace


class Regressor(Protocol):
    def predict(self, features: np.ndarray) -> np.ndarray: ...


def predict_one(regressor: Regressor, row: np.ndarray) -> float:
    """One prediction; linear models skip scikit-learn's per-call input validation."""
    coef = getattr(regressor, "coef_", None)
    intercept = getattr(regressor, "intercept_", None)
    if coef is not None and intercept is not None and np.ndim(coef) == 1:
        return float(np.dot(row.astype(np.float64), coef) + intercept)
    return float(np.asarray(regressor.predict(row[None, :]), dtype=np.float64).reshape(-1)[0])


@dataclass(frozen=True)
class LinearStage2:
    """A linear stage-2 regressor's weights, arranged as its inputs arrive (docs/method.md §4).

    `attention[k - 1]` weighs a token's whole step row as captured (`[layers, heads, N + 1]`
    flattened, float64) with every lag beyond k zeroed: token i (0-based) uses k = min(i, N),
    which is what the zeros of its feature vector do. Inputs are rounded to float32 first, as
    the feature vector holds them, so this computes C2(z_i) up to the order of the sums.
    """

    intercept: float
    probability: np.ndarray  # [N] weights of p_{i-l}, l = 1..N
    confidence: np.ndarray  # [N] weights of c_{i-l}
    current: float  # weight of p_i
    extras: np.ndarray  # [E] weights of token i's extra statistics
    attention: tuple[np.ndarray, ...]
    slots_read: int  # slots a row must have: N (generating) or N + 1 (consuming)

    @classmethod
    def of(cls, regressor: Regressor, spec: FeatureSpec) -> LinearStage2 | None:
        """The split weights, or None when the regressor is not a plain linear model of this spec's size."""
        coef = getattr(regressor, "coef_", None)
        intercept = getattr(regressor, "intercept_", None)
        if coef is None or intercept is None or np.ndim(coef) != 1 or np.ndim(intercept) != 0:
            return None
        weights = np.asarray(coef, dtype=np.float64)
        if len(weights) != spec.stage2_size:
            return None
        n_lags = spec.n_lags
        blocks = weights[: n_lags * spec.lag_block].reshape(n_lags, spec.lag_block)
        by_slot = np.zeros((spec.num_layers, spec.num_heads, n_lags + 1))  # the slots the capture records
        for lag in range(1, n_lags + 1):
            by_slot[:, :, lag - 1 + spec.slot_shift] = blocks[lag - 1, 2:].reshape(spec.num_layers, spec.num_heads)
        attention = []
        for known in range(1, n_lags + 1):
            masked = by_slot.copy()
            masked[:, :, known + spec.slot_shift :] = 0.0
            attention.append(masked.reshape(-1))
        base = n_lags * spec.lag_block
        return cls(
            intercept=float(intercept),
            probability=blocks[:, 0].copy(),
            confidence=blocks[:, 1].copy(),
            current=float(weights[base]),
            extras=weights[base + 1 :].copy(),
            attention=tuple(attention),
            slots_read=n_lags + spec.slot_shift,
        )

    def predict(
        self,
        index: int,
        probs: Sequence[np.float32] | np.ndarray,
        confidences: Sequence[float],
        row: np.ndarray,
        extras_row: np.ndarray | None,
    ) -> float:
        """C2 of the token at 0-based `index >= 1`, whose step row is `row`."""
        lags = min(len(self.probability), index)
        # Lag l = 1..lags reads position index - l: each window reversed.
        window = slice(index - lags, index)
        earlier_probs = np.asarray(probs[window], dtype=FEATURE_DTYPE)[::-1].astype(np.float64)
        earlier_confidences = np.asarray(confidences[window], dtype=FEATURE_DTYPE)[::-1].astype(np.float64)
        value = (
            self.intercept
            + self._attention_term(row, lags)
            + float(np.dot(earlier_probs, self.probability[:lags]))
            + float(np.dot(earlier_confidences, self.confidence[:lags]))
            + self.current * float(probs[index])
        )
        if len(self.extras):
            assert extras_row is not None, "the spec has extra statistics: pass them"
            value += float(np.dot(np.asarray(extras_row, dtype=FEATURE_DTYPE).astype(np.float64), self.extras))
        return value

    def _attention_term(self, row: np.ndarray, lags: int) -> float:
        weights = self.attention[lags - 1]
        recorded = len(self.probability) + 1
        slots = row.shape[-1]
        if slots == recorded:  # as captured: no copy but the float64 cast
            return float(np.dot(row.astype(np.float64).reshape(-1), weights))
        if slots < self.slots_read:
            raise ValueError(f"attention rows hold {slots} slots; {len(self.probability)} lags need more")
        used = min(slots, recorded)
        values = row[:, :, :used].astype(np.float64).reshape(-1)
        return float(np.dot(values, weights.reshape(-1, recorded)[:, :used].reshape(-1)))


@dataclass
class TadStream:
    """Incremental scoring of one sequence as its tokens and attention rows arrive."""

    scorer: TadScorer
    confidences: list[float] = field(default_factory=list)
    _probs: list[np.float32] = field(default_factory=list)

    def advance(
        self,
        logprobs: Sequence[float],
        attention_rows: Sequence[np.ndarray],
        extras: Sequence[np.ndarray] | np.ndarray | None = None,
    ) -> list[float]:
        """Score every token that can be scored now; return the new confidences.

        Token 1 needs only its probability; token i >= 2 also needs its attention row: under
        the generating convention it exists as soon as the token is sampled, under the
        consuming one a step later. `attention_rows` are step rows (docs/method.md §2);
        `extras[i]` are token i's extra statistics when the spec names some.
        """
        fresh: list[float] = []
        if len(logprobs) > len(self._probs):
            self._probs.extend(token_probabilities(logprobs[len(self._probs) :]))
        probs = self._probs
        while len(self.confidences) < len(logprobs):
            index = len(self.confidences)
            if index > 0 and index - self.scorer.spec.row_shift >= len(attention_rows):
                break
            if index == 0:
                confidence = float(probs[0])
            else:
                raw = self._predict(index, probs, attention_rows, None if extras is None else extras[index])
                # A non-finite prediction would poison every later token: treat it as no confidence.
                confidence = min(max(raw, self.scorer.epsilon), 1.0) if math.isfinite(raw) else self.scorer.epsilon
            self.confidences.append(confidence)
            fresh.append(confidence)
        return fresh

    def _predict(
        self, index: int, probs: list[np.float32], rows: Sequence[np.ndarray], extras_row: np.ndarray | None
    ) -> float:
        spec, linear = self.scorer.spec, self.scorer.linear
        if linear is not None:
            return linear.predict(index, probs, self.confidences, rows[index - spec.row_shift], extras_row)
        row = stage2_feature_row(index, probs, self.confidences, rows, spec, extras_row)
        return predict_one(self.scorer.regressor, row)


@dataclass(frozen=True)
class TadScorer:
    regressor: Regressor
    spec: FeatureSpec
    epsilon: float
    linear: LinearStage2 | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "linear", LinearStage2.of(self.regressor, self.spec))

    def stream(self) -> TadStream:
        return TadStream(scorer=self)

    def confidences(
        self, logprobs: np.ndarray, attention: np.ndarray | None, extras: np.ndarray | None = None
    ) -> np.ndarray:
        """Confidences of a whole sequence `[n]` (step rows `[>= rows_needed(n), layers, heads, slots]`)."""
        if len(logprobs) == 0:
            return np.zeros(0)
        needed = self.spec.rows_needed(len(logprobs))
        if needed and (attention is None or len(attention) < needed):
            raise ValueError(f"TAD needs {needed} attention rows for {len(logprobs)} tokens")
        stream = self.stream()
        stream.advance(list(logprobs), [] if attention is None else list(attention), extras)
        return np.array(stream.confidences, dtype=np.float64)

    def confidences_of(self, trace: TokenTrace) -> np.ndarray:
        """Confidences of a trace (its statistics supply any extra features the spec names)."""
        return self.confidences(trace.logprobs, trace.attention, self.spec.extras(trace.stats))
