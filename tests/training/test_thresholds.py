"""Reject thresholds from calibration data (training/calibration.py)."""

import math

import numpy as np
import pytest

from training.thresholds import coverage_name, coverage_threshold, error_name, error_threshold


def _quality(wrong):
    return np.where(wrong, 0.0, 1.0)


# --- coverage -----------------------------------------------------------------------------------


def test_coverage_threshold_accepts_requested_share():
    rng = np.random.default_rng(0)
    uncertainty = rng.permutation(np.linspace(0.0, 1.0, 100))
    wrong = uncertainty > 0.6
    result = coverage_threshold(uncertainty, _quality(wrong), 0.8)
    assert result.threshold in set(uncertainty.tolist())
    assert result.threshold == np.sort(uncertainty)[79]  # the 80th most confident answer
    accepted = uncertainty <= result.threshold
    assert accepted.sum() == 80
    assert result.coverage == pytest.approx(0.8)
    assert result.error == pytest.approx(wrong[accepted].mean())
    assert result.kind == "coverage"
    assert result.target == 0.8
    assert result.n == 100


def test_coverage_threshold_with_ties_is_smallest_value_reaching_the_share():
    uncertainty = np.array([0.5, 0.2, 0.1, 0.2, 0.2])
    quality = np.array([1.0, 0.0, 1.0, 1.0, 0.4])
    result = coverage_threshold(uncertainty, quality, 0.4)
    # 0.1 alone accepts 1/5 < 0.4; 0.2 accepts the tied group too: 4/5.
    assert result.threshold == 0.2
    assert result.coverage == pytest.approx(0.8)
    assert result.error == pytest.approx(2 / 4)  # qualities 0.0 and 0.4 are wrong


def test_coverage_zero_accepts_nothing():
    result = coverage_threshold(np.array([0.3, 0.1, 0.2]), np.ones(3), 0.0)
    assert result.threshold == -math.inf
    assert result.coverage == 0.0
    assert result.error == 0.0


def test_coverage_ignores_non_finite_uncertainty():
    uncertainty = np.array([0.1, np.inf, 0.3, 0.2, np.nan])
    result = coverage_threshold(uncertainty, np.ones(5), 1.0)
    assert result.threshold == 0.3
    assert result.coverage == pytest.approx(3 / 5)


def test_coverage_threshold_is_not_off_by_one_from_rounding():
    uncertainty = np.arange(90.0)
    result = coverage_threshold(uncertainty, np.ones(90), 0.7)
    assert result.coverage == pytest.approx(63 / 90)


def test_threshold_names():
    assert coverage_name(0.9) == "coverage@0.9"
    assert error_name(0.05) == "error@0.05"


# --- error rate (Learn then Test) -------------------------------------------------------------


def test_error_threshold_meets_target_on_calibration_data():
    # Answers with U > 0.7 are wrong, the rest right: at most U = 0.7 / 0.9 gives error <= 0.1.
    rng = np.random.default_rng(1)
    uncertainty = rng.uniform(size=1000)
    wrong = uncertainty > 0.7
    results = [error_threshold(uncertainty, _quality(wrong), 0.1, delta=0.05, seed=seed) for seed in range(10)]
    returned = [result for result in results if result is not None]
    assert returned
    for result in returned:
        assert result.threshold in set(uncertainty.tolist())
        accepted = uncertainty <= result.threshold
        assert result.coverage == pytest.approx(accepted.mean())
        assert result.error == pytest.approx(wrong[accepted].mean())
        assert result.error <= 0.1
        assert result.kind == "error"
        assert result.target == 0.1
        assert result.n == 1000
        assert "0.95" in result.guarantee


def test_error_threshold_none_when_every_answer_is_wrong():
    rng = np.random.default_rng(2)
    uncertainty = rng.uniform(size=500)
    assert error_threshold(uncertainty, np.zeros(500), 0.2) is None


def test_error_threshold_none_when_sample_too_small_for_any_test():
    # Half B holds 10 answers; even with no error the p-value is at least 0.95^10 ~ 0.6 > delta.
    uncertainty = np.linspace(0.0, 1.0, 20)
    assert 0.95**10 > 0.05
    assert error_threshold(uncertainty, np.ones(20), 0.05, delta=0.05) is None


def test_error_threshold_found_when_no_answer_is_wrong():
    # 400 right answers; a 10% target needs only 29 error-free accepted answers in half B.
    uncertainty = np.random.default_rng(3).uniform(size=400)
    results = [error_threshold(uncertainty, np.ones(400), 0.1, seed=seed) for seed in range(20)]
    assert all(result is not None for result in results)


def test_error_threshold_found_with_a_small_base_error_rate():
    # 2% wrong below U = 0.7 and 90% above, n = 1000: at U = 0.7 half B holds ~350 answers with ~7
    # errors, far below the 10% target (binomial p-value ~1e-9), so a threshold is clearly feasible.
    rng = np.random.default_rng(4)
    uncertainty = rng.uniform(size=1000)
    wrong = rng.uniform(size=1000) < np.where(uncertainty > 0.7, 0.9, 0.02)
    assert error_threshold(uncertainty, _quality(wrong), 0.1) is not None


def test_error_threshold_guarantee_holds_over_repeated_calibration_draws():
    # U ~ Uniform(0, 1) and P(wrong | U = u) = u^4, so the true error among accepted answers at
    # threshold t is E[U^4 | U <= t] = t^4 / 5, at most max_error exactly when t <= (5 max_error)^(1/4).
    max_error, delta, n, draws = 0.1, 0.05, 400, 200
    largest_safe = (5 * max_error) ** 0.25
    rng = np.random.default_rng(5)
    violations = returned = naive_violations = 0
    for _ in range(draws):
        uncertainty = rng.uniform(size=n)
        wrong = rng.uniform(size=n) < uncertainty**4
        result = error_threshold(uncertainty, _quality(wrong), max_error, delta=delta)
        if result is not None:
            returned += 1
            violations += result.threshold > largest_safe
        # Naive rule for comparison: the largest threshold whose calibration error is <= max_error.
        order = np.argsort(uncertainty)
        running_error = np.cumsum(wrong[order]) / np.arange(1, n + 1)
        naive = uncertainty[order][np.nonzero(running_error <= max_error)[0][-1]]
        naive_violations += naive > largest_safe
    # At a violation rate of exactly delta the count would be Binomial(200, 0.05): mean 10, sd ~3.1;
    # a slack of 0.035 (7 draws, ~2.3 sd) leaves room for chance but not for a broken guarantee.
    assert violations / draws <= delta + 0.035
    # The check has power: the naive rule violates in a large share of draws, and the tested
    # procedure returned a threshold often enough for its violation count to mean something.
    assert naive_violations / draws > 0.25
    assert returned / draws > 0.25


# --- natural order --------------------------------------------------------------------------------


def test_natural_order_certifies_a_threshold_and_keeps_its_promise_out_of_sample():
    from training.thresholds import error_threshold_natural, out_of_sample

    rng = np.random.default_rng(0)

    def draw(n):
        uncertainty = rng.uniform(size=n)
        wrong = rng.uniform(size=n) < 0.1 + 0.8 * uncertainty  # error grows with uncertainty
        return uncertainty, _quality(wrong)

    uncertainty, quality = draw(2000)
    result = error_threshold_natural(uncertainty, quality, 0.3, delta=0.05)
    assert result is not None and result.kind == "error" and result.error <= 0.3
    assert 0.1 < result.coverage < 0.5  # error among accepted is 0.1 + 0.4 t at threshold t: t ~ 0.5 at most
    fresh = out_of_sample(result, *draw(20000))
    assert fresh["error"] <= 0.3 + 0.01 and fresh["n"] == 20000
    # The natural order uses the whole set, so it certifies at least as much coverage as the split order here.
    split = error_threshold(uncertainty, quality, 0.3, delta=0.05, seed=0)
    assert split is not None and result.coverage >= split.coverage - 0.02


def test_natural_order_refuses_an_impossible_target():
    from training.thresholds import error_threshold_natural

    uncertainty = np.linspace(0, 1, 300)
    assert error_threshold_natural(uncertainty, _quality(np.ones(300, dtype=bool)), 0.2) is None
