"""Token confidences to one sequence uncertainty (higher = less trustworthy)."""

from __future__ import annotations

import math
from enum import StrEnum

import numpy as np


class Aggregation(StrEnum):
    MEAN = "mean"  # U = 1 - mean_i c_i
    SUM_LOG = "sum-log"  # U = -sum_i log c_i


def aggregate(confidences: np.ndarray, aggregation: Aggregation) -> float:
    """Sequence uncertainty from token confidences (NaN for an empty sequence)."""
    if len(confidences) == 0:
        return math.nan
    if aggregation is Aggregation.MEAN:
        return float(1.0 - np.mean(confidences))
    return float(-np.sum(np.log(confidences)))
