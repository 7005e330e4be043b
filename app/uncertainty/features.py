"""TAD feature vectors, exactly as docs/method.md §3 states them; training and serving both call these.

Ordering `tad-v1` for token i >= 2 (1-based), with N lags:

    for l = 1..N:  [ p_{i-l}, c_{i-l}, a_{i,i-l}[layer 0 head 0], ..., a_{i,i-l}[layer L-1 head H-1] ]
    then           [ p_i ]

and zeros wherever i - l < 1. Stage 1 uses only `[p_{i-1}, ..., p_{i-N}, p_i]`.

Attention comes as *step rows*: `rows[j]` is `[layers, heads, N + 1]` from the forward step
that consumes token j + 1 (1-based), slot k = the weight to the key k positions back from
that step's query. `a_{i,i-l}` is then, by the spec's convention (docs/method.md §2):

- consuming: the step consuming y_i, key l back:        rows[i - 1][..., l]
- generating: the step producing y_i (consuming y_{i-1}): rows[i - 2][..., l - 1]
Vectors are float32; probabilities are computed from log-probabilities with `math.exp`
one value at a time, so every caller gets the same bits for the same token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

FEATURE_ORDER = "tad-v1"
FEATURE_DTYPE = np.float32


# Attention lags captured when nothing names them: `generate`'s default, and the server's without an artifact.
DEFAULT_N_LAGS = 10


class Convention(StrEnum):
    """Which forward step's attention row belongs to a token."""

    CONSUMING = "consuming"  # the step that consumes y_i (query: y_i's position)
    GENERATING = "generating"  # the step that produces y_i (query: y_{i-1}'s position); the authors' code


@dataclass(frozen=True)
class FeatureSpec:
    """The shape of TAD's features for one LLM."""

    n_lags: int
    num_layers: int
    num_heads: int
    order: str = FEATURE_ORDER
    convention: Convention = Convention.CONSUMING

    @property
    def row_shift(self) -> int:
        """Token j (0-based) reads step row j - row_shift."""
        return 1 if self.convention is Convention.GENERATING else 0

    @property
    def slot_shift(self) -> int:
        """Lag l reads slot l - 1 + slot_shift of that row."""
        return 0 if self.convention is Convention.GENERATING else 1

    def rows_needed(self, n_tokens: int) -> int:
        """Step rows a sequence of n tokens needs (the generating convention never needs the last one; a
        single token none: c_1 = p_1 reads no row)."""
        return n_tokens - self.row_shift if n_tokens > 1 else 0

    @property
    def attention_size(self) -> int:
        return self.num_layers * self.num_heads

    @property
    def lag_block(self) -> int:
        return 2 + self.attention_size

    @property
    def stage1_size(self) -> int:
        return self.n_lags + 1

    @property
    def stage2_size(self) -> int:
        return self.n_lags * self.lag_block + 1

    def confidence_columns(self) -> np.ndarray:
        """Column index of c_{i-l} for l = 1..N in a stage-2 vector."""
        return np.arange(self.n_lags) * self.lag_block + 1

    def lag_attention(self, rows: Sequence[np.ndarray] | np.ndarray, index: int) -> list[float | None] | None:
        """What TAD reads of the attention of the token at 0-based `index`, averaged over layers and heads.

        Entry l - 1 is `a_{i,i-l}` (l = 1..N) from the same step row and slot as the stage-2
        features, so a display shows exactly what the regressor saw. An entry is None where
        lag l reaches before the answer (the features hold a zero there); the whole list is
        None when no lag is read (the first token, c_1 = p_1, under either convention: a stream
        sends it before any row exists) or the token's row is not captured yet.
        """
        position = index - self.row_shift
        if index == 0 or position < 0 or position >= len(rows):
            return None
        means = np.asarray(rows[position], dtype=np.float64).mean(axis=(0, 1))
        return [float(means[lag - 1 + self.slot_shift]) if lag <= index else None for lag in range(1, self.n_lags + 1)]


def token_probabilities(logprobs: Sequence[float] | np.ndarray) -> np.ndarray:
    """p_i = exp(log p_i) as float32, element by element (no vector-path rounding differences)."""
    return np.array([math.exp(float(value)) for value in logprobs], dtype=FEATURE_DTYPE)


def stage1_features(probs: np.ndarray, n_lags: int) -> np.ndarray:
    """Stage-1 vectors `[n - 1, N + 1]` of tokens 2..n: `[p_{i-1}, ..., p_{i-N}, p_i]`."""
    n = len(probs)
    features = np.zeros((max(n - 1, 0), n_lags + 1), dtype=FEATURE_DTYPE)
    for lag in range(1, n_lags + 1):
        rows = np.arange(max(lag - 1, 0), n - 1)  # row r is token r + 2 (1-based); needs r + 1 - lag >= 0
        features[rows, lag - 1] = probs[rows + 1 - lag]
    features[:, -1] = probs[1:]
    return features


def stage2_features(probs: np.ndarray, confidences: np.ndarray, rows: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """Stage-2 vectors `[n - 1, spec.stage2_size]` of tokens 2..n from step rows (see the module docstring)."""
    n = len(probs)
    features = np.zeros((max(n - 1, 0), spec.stage2_size), dtype=FEATURE_DTYPE)
    if n < 2:
        return features
    _check_rows(rows, n, spec)
    for lag in range(1, spec.n_lags + 1):
        targets = np.arange(lag - 1, n - 1)  # feature row r describes token r + 1 (0-based)
        if len(targets) == 0:
            break
        earlier = targets + 1 - lag
        offset = (lag - 1) * spec.lag_block
        features[targets, offset] = probs[earlier]
        features[targets, offset + 1] = confidences[earlier]
        block = rows[targets + 1 - spec.row_shift, :, :, lag - 1 + spec.slot_shift]
        features[targets, offset + 2 : offset + spec.lag_block] = block.reshape(len(targets), spec.attention_size)
    features[:, -1] = probs[1:]
    return features


def stage2_feature_row(
    index: int,
    probs: Sequence[float | np.floating[Any]] | np.ndarray,
    confidences: Sequence[float] | np.ndarray,
    rows: Sequence[np.ndarray] | np.ndarray,
    spec: FeatureSpec,
) -> np.ndarray:
    """The stage-2 vector of the token at 0-based `index >= 1`, same bits as `stage2_features`."""
    vector = np.zeros(spec.stage2_size, dtype=FEATURE_DTYPE)
    row = rows[index - spec.row_shift]
    for lag in range(1, min(spec.n_lags, index) + 1):
        offset = (lag - 1) * spec.lag_block
        vector[offset] = probs[index - lag]
        vector[offset + 1] = confidences[index - lag]
        vector[offset + 2 : offset + spec.lag_block] = row[:, :, lag - 1 + spec.slot_shift].reshape(spec.attention_size)
    vector[-1] = probs[index]
    return vector


def _check_rows(rows: np.ndarray, n: int, spec: FeatureSpec) -> None:
    needed = spec.rows_needed(n)
    if rows.ndim != 4 or rows.shape[0] < needed or rows.shape[1:3] != (spec.num_layers, spec.num_heads):
        raise ValueError(
            f"attention rows have shape {rows.shape}, expected at least "
            f"({needed}, {spec.num_layers}, {spec.num_heads}, >= {spec.n_lags + spec.slot_shift})"
        )
    if rows.shape[3] < spec.n_lags + spec.slot_shift:
        raise ValueError(f"attention rows hold {rows.shape[3]} slots; {spec.n_lags} lags need more")
