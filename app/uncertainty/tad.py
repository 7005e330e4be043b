"""The recurrent TAD scorer: token confidences c_i from the trained stage-2 regressor.

c_1 = p_1; for i >= 2, c_i = clip(C2(z_i), eps, 1), where z_i holds the confidences of
the N tokens before i. Streaming and whole-sequence scoring run the same per-token code,
so a streamed answer gets exactly the confidences of the same answer scored at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from app.uncertainty.features import FeatureSpec, stage2_feature_row, token_probabilities
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


@dataclass
class TadStream:
    """Incremental scoring of one sequence as its tokens and attention rows arrive."""

    scorer: TadScorer
    confidences: list[float] = field(default_factory=list)
    features: list[np.ndarray] = field(default_factory=list)
    keep_features: bool = False
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
                extras_row = None if extras is None else extras[index]
                row = stage2_feature_row(index, probs, self.confidences, attention_rows, self.scorer.spec, extras_row)
                if self.keep_features:
                    self.features.append(row)
                raw = predict_one(self.scorer.regressor, row)
                # A non-finite prediction would poison every later token: treat it as no confidence.
                confidence = min(max(raw, self.scorer.epsilon), 1.0) if math.isfinite(raw) else self.scorer.epsilon
            self.confidences.append(confidence)
            fresh.append(confidence)
        return fresh


@dataclass(frozen=True)
class TadScorer:
    regressor: Regressor
    spec: FeatureSpec
    epsilon: float

    def stream(self, keep_features: bool = False) -> TadStream:
        return TadStream(scorer=self, keep_features=keep_features)

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
