from __future__ import annotations

import math

import numpy as np
import pytest

from app.api.common import SequenceScores
from app.engine.token_stats import TOKEN_STATISTICS
from app.settings import Settings
from app.uncertainty.aggregation import Aggregation, aggregate
from app.uncertainty.methods import (
    METHODS,
    Method,
    MethodInput,
    maximum_sequence_probability,
    maximum_token_uncertainty,
    mean_token_entropy,
    perplexity,
    score_all,
)
from app.uncertainty.trace import TokenTrace


def _trace(logprobs: np.ndarray, entropies: np.ndarray) -> TokenTrace:
    return TokenTrace(
        token_ids=tuple(range(len(logprobs))), stats={"logprob": logprobs, "entropy": entropies}, attention=None
    )


def test_aggregations() -> None:
    c = np.array([0.9, 0.5, 0.8])
    assert aggregate(c, Aggregation.MEAN) == pytest.approx(1 - (0.9 + 0.5 + 0.8) / 3)
    assert aggregate(c, Aggregation.SUM_LOG) == pytest.approx(-(math.log(0.9) + math.log(0.5) + math.log(0.8)))
    assert aggregate(c, Aggregation.MEAN_LOG) == pytest.approx(-(math.log(0.9) + math.log(0.5) + math.log(0.8)) / 3)
    assert aggregate(c, Aggregation.MIN) == pytest.approx(0.5)
    for aggregation in Aggregation:
        assert math.isnan(aggregate(np.zeros(0), aggregation))
    # c_1 = p_1 is not clipped: a first token of probability 0 gives a finite, very large score.
    zero_first = np.array([0.0, 0.5])
    for aggregation in (Aggregation.SUM_LOG, Aggregation.MEAN_LOG):
        assert math.isfinite(aggregate(zero_first, aggregation)) and aggregate(zero_first, aggregation) > 300


def test_aggregations_rank_as_documented() -> None:
    # mean-log drops sum-log's length penalty: a long answer of safe tokens no longer ranks
    # behind a short one of doubtful tokens; min ranks by the weakest token alone.
    long_safe, short_doubtful = np.full(40, 0.9), np.array([0.6, 0.6])
    assert aggregate(long_safe, Aggregation.SUM_LOG) > aggregate(short_doubtful, Aggregation.SUM_LOG)
    assert aggregate(long_safe, Aggregation.MEAN_LOG) < aggregate(short_doubtful, Aggregation.MEAN_LOG)
    one_weak = np.array([0.95, 0.95, 0.95, 0.2])
    evenly_unsure = np.array([0.6, 0.6, 0.6, 0.6])
    assert aggregate(one_weak, Aggregation.MEAN) < aggregate(evenly_unsure, Aggregation.MEAN)
    assert aggregate(one_weak, Aggregation.MIN) > aggregate(evenly_unsure, Aggregation.MIN)


def test_baselines() -> None:
    logprobs = np.log([0.5, 0.25])
    assert maximum_sequence_probability(logprobs) == pytest.approx(math.log(8))
    assert perplexity(logprobs) == pytest.approx(math.log(8) / 2)
    assert mean_token_entropy(np.array([1.0, 2.0])) == 1.5
    confidences = np.array([0.8, 0.6])  # mean aggregation: TAD = 0.3
    answer = MethodInput(_trace(logprobs, np.array([1.0, 2.0])), confidences, Aggregation.MEAN)
    scores = score_all(answer, tad_available=True)
    assert scores.get(Method.TAD) == pytest.approx(0.3) and scores.get(Method.MSP) == pytest.approx(math.log(8))
    empty = score_all(MethodInput(_trace(np.zeros(0), np.zeros(0))), tad_available=False)
    assert math.isnan(empty.get(Method.MSP)) and empty.get(Method.TAD) is None


def test_maximum_token_uncertainty_is_the_least_likely_token() -> None:
    logprobs = np.log([0.9, 0.2, 0.5])
    assert maximum_token_uncertainty(logprobs) == pytest.approx(-math.log(0.2))
    scores = score_all(MethodInput(_trace(logprobs, np.zeros(3))), tad_available=False)
    assert scores.get(Method.MAX_TOKEN_UNCERTAINTY) == pytest.approx(-math.log(0.2))
    assert math.isnan(maximum_token_uncertainty(np.zeros(0)))


def test_the_registry_is_what_every_consumer_sees() -> None:
    names = [method.name for method in METHODS]
    assert len(set(names)) == len(names)
    assert [m.value for m in Method] == names
    assert list(SequenceScores.model_fields) == names  # the response schema has one field per method
    for method in METHODS:
        assert set(method.token_stats) <= set(TOKEN_STATISTICS), method.name
        assert Settings(reject_method=method.name).reject_method.value == method.name


def test_rauq_on_a_hand_made_case() -> None:
    from app.uncertainty.methods import rauq, rauq_layers

    assert list(rauq_layers(30)) == list(range(10, 21)) and list(rauq_layers(3)) == [1, 2]
    p = np.array([0.5, 0.8, 0.4])
    rows = np.zeros((2, 3, 2, 3))  # step rows: [step, layer, head, keys back]; slot 0 = the query itself
    rows[:, 1, 0, 0] = [0.9, 0.7]  # layer 1: head 0 attends more to the previous token (mean 0.8 > 0.15)
    rows[:, 1, 1, 0] = [0.1, 0.2]
    rows[:, 2, 1, 0] = [0.3, 0.5]  # layer 2: head 1 (mean 0.4 > 0)
    rows[:, 0, 0, 0] = [1.0, 1.0]  # layer 0 is outside the middle third: ignored
    alpha = 0.5

    def layer_uncertainty(weights: list[float]) -> float:
        c = [p[0]]
        for j in (1, 2):
            c.append(alpha * p[j] + (1 - alpha) * weights[j - 1] * c[-1])
        return 1 - float(np.mean(np.log(c)))

    expected = max(layer_uncertainty([0.9, 0.7]), layer_uncertainty([0.3, 0.5]))
    assert rauq(np.log(p), rows, alpha) == pytest.approx(expected)
    assert math.isnan(rauq(np.log(p), None)) and math.isnan(rauq(np.zeros(0), rows))


def test_attention_score_on_a_hand_made_case() -> None:
    from app.uncertainty.methods import attention_score

    rows = np.full((3, 4, 2, 3), 0.5)  # step rows [step, layer, head, keys back]; slot 0 = the query itself
    rows[:, 2, 0, 0] = [0.9, 0.4, 0.123]  # layer 4 // 2 = 2; the third token's own row is not read
    rows[:, 2, 1, 0] = [0.2, 0.8, 0.456]
    expected = -(math.log(0.9) + math.log(0.4) + math.log(0.2) + math.log(0.8)) / 2
    assert attention_score(rows, 3) == pytest.approx(expected, rel=1e-9)
    assert attention_score(rows[:2], 3) == pytest.approx(expected, rel=1e-9)  # the generating convention's rows
    # A head that attends less to the token itself makes the answer less trusted.
    lower = rows.copy()
    lower[0, 2, 0, 0] = 0.3
    assert attention_score(lower, 3) > attention_score(rows, 3)
    assert attention_score(rows, 1) == 0.0  # one token: no diagonal entry before the last
    assert math.isnan(attention_score(None, 3)) and math.isnan(attention_score(rows[:1], 3))
    assert math.isnan(attention_score(rows, 0))


def test_a_one_token_answer_needs_no_attention_rows() -> None:
    # Under the generating convention the last token's own step is not run, so a one-token answer
    # (max_new_tokens 1, a multiple-choice letter) has no rows at all: neither method reads any.
    from app.uncertainty.methods import attention_score, rauq

    assert rauq(np.log([0.5]), None) == pytest.approx(1.0 - math.log(0.5))
    assert attention_score(None, 1) == 0.0
    assert math.isfinite(rauq(np.array([-math.inf]), None))  # probability 0: huge, not inf
