"""Sequence-level uncertainty: TAD aggregation and the baselines (higher = less trustworthy)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import StrEnum

import numpy as np


class Aggregation(StrEnum):
    MEAN = "mean"  # U = 1 - mean_i c_i
    SUM_LOG = "sum-log"  # U = -sum_i log c_i


class Method(StrEnum):
    TAD = "tad"
    MSP = "msp"
    PERPLEXITY = "perplexity"
    MEAN_TOKEN_ENTROPY = "mean_token_entropy"


BASELINES = (Method.MSP, Method.PERPLEXITY, Method.MEAN_TOKEN_ENTROPY)


def aggregate(confidences: np.ndarray, aggregation: Aggregation) -> float:
    """Sequence uncertainty from token confidences (NaN for an empty sequence)."""
    if len(confidences) == 0:
        return math.nan
    if aggregation is Aggregation.MEAN:
        return float(1.0 - np.mean(confidences))
    return float(-np.sum(np.log(confidences)))


def maximum_sequence_probability(logprobs: np.ndarray) -> float:
    """MSP uncertainty: -sum_i log p_i."""
    return float(-np.sum(logprobs)) if len(logprobs) else math.nan


def perplexity(logprobs: np.ndarray) -> float:
    """Perplexity uncertainty as METHOD.md defines it: -mean_i log p_i."""
    return float(-np.mean(logprobs)) if len(logprobs) else math.nan


def mean_token_entropy(entropies: np.ndarray) -> float:
    return float(np.mean(entropies)) if len(entropies) else math.nan


@dataclass(frozen=True)
class SequenceUncertainty:
    """Every method's sequence uncertainty; `tad` is None when no TAD artifact is loaded."""

    tad: float | None
    msp: float
    perplexity: float
    mean_token_entropy: float

    def get(self, method: Method) -> float | None:
        return getattr(self, method.value)

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)


def baseline_uncertainty(logprobs: np.ndarray, entropies: np.ndarray, tad: float | None) -> SequenceUncertainty:
    return SequenceUncertainty(
        tad=tad,
        msp=maximum_sequence_probability(logprobs),
        perplexity=perplexity(logprobs),
        mean_token_entropy=mean_token_entropy(entropies),
    )
