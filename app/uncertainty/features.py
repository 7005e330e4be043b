"""TAD feature vectors, exactly as docs/method.md §3 states them; training and serving both call these.

Ordering `tad-v1` for token i >= 2 (1-based), with N lags:

    for l = 1..N:  [ p_{i-l}, c_{i-l}, a_{i,i-l}[layer 0 head 0], ..., a_{i,i-l}[layer L-1 head H-1] ]
    then           [ p_i ]

and zeros wherever i - l < 1. Stage 1 uses only `[p_{i-1}, ..., p_{i-N}, p_i]`.
Vectors are float32; probabilities are computed from log-probabilities with `math.exp`
one value at a time, so every caller gets the same bits for the same token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FEATURE_ORDER = "tad-v1"
FEATURE_DTYPE = np.float32


@dataclass(frozen=True)
class FeatureSpec:
    """The shape of TAD's features for one LLM."""

    n_lags: int
    num_layers: int
    num_heads: int
    order: str = FEATURE_ORDER

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

    def as_dict(self) -> dict[str, int | str]:
        return {
            "order": self.order,
            "n_lags": self.n_lags,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "stage1_size": self.stage1_size,
            "stage2_size": self.stage2_size,
        }


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


def stage2_features(probs: np.ndarray, confidences: np.ndarray, attention: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """Stage-2 vectors `[n - 1, spec.stage2_size]` of tokens 2..n.

    `attention[j]` is the row of token j + 1 (1-based) `[layers, heads, lags]`.
    """
    n = len(probs)
    features = np.zeros((max(n - 1, 0), spec.stage2_size), dtype=FEATURE_DTYPE)
    if n < 2:
        return features
    _check_attention(attention, n, spec)
    for lag in range(1, spec.n_lags + 1):
        rows = np.arange(lag - 1, n - 1)
        if len(rows) == 0:
            break
        earlier = rows + 1 - lag
        offset = (lag - 1) * spec.lag_block
        features[rows, offset] = probs[earlier]
        features[rows, offset + 1] = confidences[earlier]
        block = attention[rows + 1, :, :, lag - 1].reshape(len(rows), spec.attention_size)
        features[rows, offset + 2 : offset + spec.lag_block] = block
    features[:, -1] = probs[1:]
    return features


def stage2_feature_row(
    index: int,
    probs: Sequence[float] | np.ndarray,
    confidences: Sequence[float] | np.ndarray,
    attention_row: np.ndarray,
    spec: FeatureSpec,
) -> np.ndarray:
    """The stage-2 vector of the token at 0-based `index >= 1`, same bits as `stage2_features`."""
    row = np.zeros(spec.stage2_size, dtype=FEATURE_DTYPE)
    for lag in range(1, min(spec.n_lags, index) + 1):
        offset = (lag - 1) * spec.lag_block
        row[offset] = probs[index - lag]
        row[offset + 1] = confidences[index - lag]
        row[offset + 2 : offset + spec.lag_block] = attention_row[:, :, lag - 1].reshape(spec.attention_size)
    row[-1] = probs[index]
    return row


def _check_attention(attention: np.ndarray, n: int, spec: FeatureSpec) -> None:
    expected = (n, spec.num_layers, spec.num_heads, spec.n_lags)
    if attention.shape != expected:
        raise ValueError(f"attention rows have shape {attention.shape}, expected {expected}")
