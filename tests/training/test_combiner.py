"""The sequence-level combiner: its inputs are the registry's numbers, it is scored out of fold, and it learns."""

from __future__ import annotations

import math

import numpy as np

from tests.fixtures.traces import uniform_trace
from training.combiner import INPUTS, combiner_inputs, cross_validate_combiner, informative_mean, per_dataset_prr
from training.rejection import prediction_rejection_ratio


def test_inputs_are_tad_aggregations_baselines_and_length() -> None:
    trace = uniform_trace([math.log(0.5), math.log(0.25)])
    values = dict(zip(INPUTS, combiner_inputs(trace, np.array([0.8, 0.4])), strict=True))
    assert math.isclose(values["tad_mean"], 0.4)
    assert math.isclose(values["tad_sum_log"], -math.log(0.8) - math.log(0.4))
    assert math.isclose(values["msp"], math.log(8.0))
    assert math.isclose(values["perplexity"], math.log(8.0) / 2)
    assert values["mean_token_entropy"] == 0.5
    assert math.isfinite(values["rauq"])
    assert math.isclose(values["log_length"], math.log(3.0))


def test_an_empty_answer_is_most_uncertain_and_an_informative_input_is_learned() -> None:
    rng = np.random.default_rng(0)
    n = 400
    targets = (rng.random(n) < 0.4).astype(float)
    features = rng.normal(size=(n, len(INPUTS)))
    informative_column = INPUTS.index("msp")
    features[:, informative_column] = (1.0 - targets) + rng.normal(scale=0.3, size=n)  # high when wrong
    features[0, :-1] = np.nan  # an empty answer: nothing but its length is defined
    fold_of = np.arange(n) % 5
    result = cross_validate_combiner(
        features, targets, fold_of, lambda scores, held: prediction_rejection_ratio(scores, targets[held])
    )
    assert result.scores[0] == math.inf
    assert np.all(np.isfinite(result.scores[1:]))
    assert min(result.fold_prr) > 0.6
    largest = max(result.coefficients, key=lambda name: abs(result.coefficients[name]))
    assert largest == "msp" and result.coefficients["msp"] < 0  # predicts quality, so negative for an uncertainty


def test_per_dataset_table_and_the_informative_mean() -> None:
    targets = np.array([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    good = np.array([0.1, 0.9, 0.2, 0.8, 0.5, 0.6, 0.7, 0.4])
    table = per_dataset_prr({"good": good, "bad": -good}, targets, ["a"] * 4 + ["b"] * 4)
    assert table["a"]["n"] == 4 and table["a"]["accuracy"] == 0.5 and table["b"]["accuracy"] == 0.0
    assert table["a"]["good"] == 1.0 and table["a"]["bad"] < 0
    assert informative_mean(table, "good") == 1.0  # dataset b (accuracy 0) is left out
