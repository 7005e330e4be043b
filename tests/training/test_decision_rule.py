"""The decision rule: the reference unless the best challenger's paired interval of the gain excludes 0."""

from __future__ import annotations

import math

import numpy as np
import pytest

from training.decision_rule import bootstrap_interval, choose, fold_interval


def test_a_challenger_ahead_on_every_fold_replaces_the_reference() -> None:
    rule = choose("tad", {"tad": [0.30, 0.32, 0.28, 0.31, 0.29], "msp": [0.40, 0.43, 0.37, 0.41, 0.40]}, "folds")
    assert rule.challenger == "msp" and rule.chosen == "msp"
    assert rule.gain == pytest.approx(0.102) and rule.interval is not None and rule.interval[0] > 0


def test_a_gain_inside_the_noise_keeps_the_reference() -> None:
    # Ahead on average, behind on two folds: the interval straddles 0.
    rule = choose("tad", {"tad": [0.30, 0.40, 0.20, 0.35, 0.25], "msp": [0.45, 0.30, 0.35, 0.30, 0.30]}, "folds")
    assert rule.challenger == "msp" and rule.gain > 0
    assert rule.interval is not None and rule.interval[0] < 0 < rule.interval[1]
    assert rule.chosen == "tad"


def test_the_best_challenger_is_the_one_tested() -> None:
    samples = {"tad": [0.5] * 5, "msp": [0.2, 0.3, 0.2, 0.3, 0.2], "rauq": [0.6, 0.61, 0.62, 0.6, 0.61]}
    rule = choose("tad", samples, "folds")
    assert rule.challenger == "rauq" and rule.chosen == "rauq"
    assert rule.as_dict()["chosen"] == "rauq" and rule.means["msp"] == pytest.approx(0.24)


def test_nothing_to_compare_keeps_the_reference() -> None:
    rule = choose("msp", {"msp": [0.3, 0.4], "rauq": [math.nan, math.nan]}, "bootstrap")
    assert rule.challenger is None and rule.chosen == "msp"


def test_the_intervals() -> None:
    # t with 4 degrees of freedom: 2.776 standard errors either side, each the folds' spread times
    # sqrt(1/5 + 1/4) (Nadeau-Bengio: the folds share training data), not 1/sqrt(5).
    low, high = fold_interval([0.1, 0.2, 0.3, 0.2, 0.2])
    assert (low + high) / 2 == pytest.approx(0.2)
    spread = np.std([0.1, 0.2, 0.3, 0.2, 0.2], ddof=1)
    assert high - low == pytest.approx(2 * 2.776445 * spread * math.sqrt(1 / 5 + 1 / 4))
    assert high - low == pytest.approx(1.5 * 2 * 2.776445 * spread / math.sqrt(5))
    assert fold_interval([0.1]) is None
    samples = np.linspace(-1, 1, 2001)
    assert bootstrap_interval(samples) == pytest.approx((-0.95, 0.95))


def test_the_best_of_several_challengers_is_tested_at_a_level_corrected_for_the_choice() -> None:
    """The best of K scores is the one tested: each interval at 1 - 0.05/K keeps the rule's 95% over them."""
    noise = np.random.default_rng(0).normal(0.0, 0.1, (5, 5))
    samples = {"tad": [0.5] * 5, **{f"score{i}": list(0.5 + noise[i]) for i in range(5)}}
    rule = choose("tad", samples, "folds")
    assert rule.level == pytest.approx(1 - 0.05 / 5) and rule.as_dict()["level"] == rule.level
    differences = np.array(samples[rule.challenger]) - 0.5
    assert rule.interval == pytest.approx(fold_interval(differences, 1 - 0.05 / 5))
    wider = fold_interval(differences, 0.99)
    narrower = fold_interval(differences)
    assert wider is not None and narrower is not None and wider[0] < narrower[0]
