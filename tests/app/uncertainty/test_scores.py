from __future__ import annotations

import math

import numpy as np
import pytest

from app.uncertainty.scores import (
    Aggregation,
    Method,
    aggregate,
    baseline_uncertainty,
    maximum_sequence_probability,
    mean_token_entropy,
    perplexity,
)


def test_aggregations() -> None:
    c = np.array([0.9, 0.5, 0.8])
    assert aggregate(c, Aggregation.MEAN) == pytest.approx(1 - (0.9 + 0.5 + 0.8) / 3)
    assert aggregate(c, Aggregation.SUM_LOG) == pytest.approx(-(math.log(0.9) + math.log(0.5) + math.log(0.8)))
    assert math.isnan(aggregate(np.zeros(0), Aggregation.MEAN))


def test_baselines() -> None:
    logprobs = np.log([0.5, 0.25])
    assert maximum_sequence_probability(logprobs) == pytest.approx(math.log(8))
    assert perplexity(logprobs) == pytest.approx(math.log(8) / 2)
    assert mean_token_entropy(np.array([1.0, 2.0])) == 1.5
    scores = baseline_uncertainty(logprobs, np.array([1.0, 2.0]), tad=0.3)
    assert scores.get(Method.TAD) == 0.3 and scores.get(Method.MSP) == pytest.approx(math.log(8))
    empty = baseline_uncertainty(np.zeros(0), np.zeros(0), None)
    assert math.isnan(empty.msp) and empty.tad is None
