"""The decision blend: standardised scores weighted and summed, as the artifact stores them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.uncertainty.aggregation import Aggregation
from app.uncertainty.blend import Blend, BlendTerm
from app.uncertainty.methods import REGISTRY, MethodInput, score_all
from tests.fixtures.traces import uniform_trace

BLEND = Blend((BlendTerm("tad", 0.7, 0.8, 0.1), BlendTerm("perplexity", 0.3, 1.0, 0.5)))


def test_the_blend_is_the_weighted_sum_of_standardised_scores() -> None:
    assert BLEND.score({"tad": 0.9, "perplexity": 2.0}) == pytest.approx(0.7 * (0.9 - 0.8) / 0.1 + 0.3 * 1.0 / 0.5)
    assert math.isnan(BLEND.score({"tad": 0.9, "perplexity": math.nan}))
    assert math.isnan(BLEND.score({"tad": None, "perplexity": 1.0}))


def test_tad_blend_reads_the_other_methods_of_the_same_answer() -> None:
    confidences = np.array([0.5, 0.9, 0.7])
    answer = MethodInput(
        trace=uniform_trace([-0.1, -2.0, -0.5]),
        tad_confidences=confidences,
        tad_aggregation=Aggregation.MEAN,
        blend=BLEND,
    )
    expected = BLEND.score({"tad": 1 - confidences.mean(), "perplexity": (0.1 + 2.0 + 0.5) / 3})
    assert REGISTRY["tad_blend"](answer) == pytest.approx(expected)
    assert score_all(answer, tad_available=True).as_dict()["tad_blend"] == pytest.approx(expected)


def test_without_a_blend_tad_blend_is_unavailable_not_nan() -> None:
    answer = MethodInput(trace=uniform_trace([-0.1]), tad_confidences=np.array([0.5]), tad_aggregation=Aggregation.MEAN)
    assert score_all(answer, tad_available=True).as_dict()["tad_blend"] is None
    assert score_all(MethodInput(trace=uniform_trace([-0.1])), tad_available=False).as_dict()["tad_blend"] is None
