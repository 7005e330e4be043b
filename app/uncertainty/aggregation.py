"""Token confidences to one sequence uncertainty (higher = less trustworthy).

`mean` and `sum-log` are the paper's two. The other two are candidates beyond the paper that
`fit` cross-validates beside them: `mean-log` is sum-log without its length penalty (what
perplexity is to MSP), which matters once answers run from 1 to 64 tokens; `min` scores an
answer by its least trusted token (what the max-token-uncertainty baseline does with p_i),
because a long answer is often wrong in one entity while its other tokens are safe.
"""

from __future__ import annotations

import math
from enum import StrEnum

import numpy as np


class Aggregation(StrEnum):
    MEAN = "mean"  # U = 1 - mean_i c_i
    SUM_LOG = "sum-log"  # U = -sum_i log c_i
    MEAN_LOG = "mean-log"  # U = -mean_i log c_i
    MIN = "min"  # U = 1 - min_i c_i


LOG_FLOOR = 1e-300


def _log(confidences: np.ndarray) -> np.ndarray:
    # c_1 = p_1 is not clipped (METHOD.md): a first token of probability 0 would make the score inf,
    # which JSON shows as null, like an empty answer's. Floored, it is finite and very large (690 for
    # that token alone under sum-log).
    return np.log(np.maximum(confidences, LOG_FLOOR))


def aggregate(confidences: np.ndarray, aggregation: Aggregation) -> float:
    """Sequence uncertainty from token confidences (NaN for an empty sequence)."""
    if len(confidences) == 0:
        return math.nan
    match aggregation:
        case Aggregation.MEAN:
            return float(1.0 - np.mean(confidences))
        case Aggregation.SUM_LOG:
            return float(-np.sum(_log(confidences)))
        case Aggregation.MEAN_LOG:
            return float(-np.mean(_log(confidences)))
        case Aggregation.MIN:
            return float(1.0 - np.min(confidences))
        case _:
            raise ValueError(f"unknown aggregation {aggregation!r}")
