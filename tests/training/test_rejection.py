"""PRR, rejection curves, ROC-AUC and accuracy from training/metrics.py."""

import math

import numpy as np
import pytest

from training.rejection import (
    GRID_POINTS,
    MAX_REJECTION,
    accuracy,
    oracle_curve,
    prediction_rejection_ratio,
    rejection_curve,
    roc_auc_wrong,
)


def test_grid_is_zero_to_half_in_steps_of_a_thousandth():
    grid, _ = rejection_curve(np.arange(10.0), np.ones(10))
    assert len(grid) == GRID_POINTS
    assert grid[0] == 0.0
    assert grid[-1] == MAX_REJECTION
    np.testing.assert_allclose(np.diff(grid), 0.001)


def test_rejection_curve_at_zero_is_overall_mean():
    rng = np.random.default_rng(1)
    quality = rng.uniform(size=37)
    uncertainty = rng.normal(size=37)
    _, curve = rejection_curve(uncertainty, quality)
    assert curve[0] == pytest.approx(quality.mean(), rel=1e-12)


def test_rejection_curve_drops_most_uncertain_first():
    # Uncertainties 0..9; at r = 0.3 the three most uncertain (qualities of u = 7, 8, 9) are gone.
    quality = np.array([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.0, 0.0, 0.0])
    uncertainty = np.arange(10.0)
    grid = np.array([0.0, 0.1, 0.3, 0.5])
    _, curve = rejection_curve(uncertainty, quality, grid)
    expected = [quality.mean(), quality[:9].mean(), quality[:7].mean(), quality[:5].mean()]
    np.testing.assert_allclose(curve, expected)


def test_oracle_ordering_gives_exactly_one():
    rng = np.random.default_rng(2)
    quality = rng.uniform(size=200)
    # Uncertainty is a decreasing function of quality: the oracle order.
    assert prediction_rejection_ratio(-quality, quality) == pytest.approx(1.0, abs=1e-12)
    assert prediction_rejection_ratio(1.0 / (1.0 + quality), quality) == pytest.approx(1.0, abs=1e-12)


def test_anti_oracle_ordering_is_negative():
    rng = np.random.default_rng(3)
    quality = rng.uniform(size=200)
    assert prediction_rejection_ratio(quality, quality) < 0


def test_anti_oracle_on_balanced_binary_quality_is_minus_one():
    # n even, half right: keeping k texts the oracle mean is (n/2)/k and the anti-oracle mean is
    # (k - n/2)/k, both (n/2 - k/2)/k away from 1/2 on opposite sides, so the areas are mirror images.
    quality = np.array([1.0, 0.0] * 50)
    assert prediction_rejection_ratio(quality, quality) == pytest.approx(-1.0, abs=1e-12)


def test_random_uncertainty_gives_about_zero():
    rng = np.random.default_rng(4)
    n = 5000
    quality = (rng.uniform(size=n) < 0.6).astype(float)
    uncertainty = rng.uniform(size=n)
    assert abs(prediction_rejection_ratio(uncertainty, quality)) < 0.05


def test_constant_uncertainty_gives_zero_because_ties_are_averaged():
    quality = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.25, 0.75, 0.0])
    assert prediction_rejection_ratio(np.zeros(8), quality) == pytest.approx(0.0, abs=1e-12)
    # The tied curve is flat at the mean, whatever the input order.
    _, curve = rejection_curve(np.full(8, 3.0), quality)
    np.testing.assert_allclose(curve, quality.mean())


def test_tied_group_is_replaced_by_its_mean():
    # u: 0 (q=1), then a tie at u=1 with q=1 and q=0, then u=2 (q=0). Rejecting one text
    # (r = 0.25) keeps {1, tie, tie}: (1 + 2 * 0.5) / 3; rejecting two (r = 0.5) keeps {1, tie}:
    # (1 + 0.5) / 2, as if one tied text were half right, whatever the order inside the tie.
    grid = np.array([0.25, 0.5])
    quality = np.array([0.0, 1.0, 0.0, 1.0])
    uncertainty = np.array([2.0, 1.0, 1.0, 0.0])
    _, curve = rejection_curve(uncertainty, quality, grid)
    np.testing.assert_allclose(curve, [2 / 3, 0.75])
    _, swapped = rejection_curve(uncertainty, quality[[0, 2, 1, 3]], grid)
    np.testing.assert_allclose(swapped, curve)


def test_hand_worked_four_text_example():
    # Four texts, most confident first: qualities 1.0, 0.0, 0.6, 0.2.
    quality = np.array([0.2, 0.6, 1.0, 0.0])
    uncertainty = np.array([4.0, 3.0, 1.0, 2.0])

    # On the grid r = 0, 0.001, ..., 0.5, the number kept is 4 - floor(4 r):
    # 4 at indices 0..249, 3 at 250..499, 2 at index 500. Trapezoids of width 0.001 give
    # area = 0.001 * (249.5 * m4 + 250 * m3 + 0.5 * m2), with m_k the mean of the k kept.
    def area(m4, m3, m2):
        return 0.001 * (249.5 * m4 + 250 * m3 + 0.5 * m2)

    mean = (1.0 + 0.0 + 0.6 + 0.2) / 4  # 0.45
    method = area(mean, (1.0 + 0.0 + 0.6) / 3, (1.0 + 0.0) / 2)
    oracle = area(mean, (1.0 + 0.6 + 0.2) / 3, (1.0 + 0.6) / 2)
    random = area(mean, mean, mean)
    expected = (method - random) / (oracle - random)
    # (0.25 * (1.6/3 - 0.45) + 0.0005 * 0.05) / (0.25 * 0.15 + 0.0005 * 0.35) = 0.0208583 / 0.037675
    assert expected == pytest.approx((250 * (1.6 / 3 - 0.45) + 0.5 * 0.05) / (250 * 0.15 + 0.5 * 0.35))
    assert prediction_rejection_ratio(uncertainty, quality) == pytest.approx(expected, rel=1e-9)


def test_oracle_curve_dominates_method_curve():
    rng = np.random.default_rng(5)
    quality = rng.uniform(size=300)
    uncertainty = rng.uniform(size=300)
    grid, method = rejection_curve(uncertainty, quality)
    _, oracle = oracle_curve(quality, grid)
    assert np.all(oracle >= method - 1e-12)
    assert oracle[-1] > method[-1]


def test_prr_is_nan_when_undefined():
    assert math.isnan(prediction_rejection_ratio(np.array([0.1]), np.array([1.0])))
    # All qualities equal: the oracle is no better than random, so the ratio has no meaning.
    assert math.isnan(prediction_rejection_ratio(np.array([0.1, 0.2, 0.3]), np.ones(3)))


def test_roc_auc_is_nan_with_one_class():
    uncertainty = np.array([0.1, 0.2, 0.3])
    assert math.isnan(roc_auc_wrong(uncertainty, np.array([1.0, 0.5, 0.9])))
    assert math.isnan(roc_auc_wrong(uncertainty, np.array([0.0, 0.49, 0.2])))


def test_roc_auc_hand_checked():
    # Wrong answers (quality < 0.5) have u = 0.4 and 0.2; right ones (quality 1.0 and exactly 0.5)
    # have u = 0.1 and 0.3. Of the 4 (wrong, right) pairs, the wrong one is more uncertain in 3:
    # (0.4, 0.1), (0.4, 0.3), (0.2, 0.1); not in (0.2, 0.3). AUC = 3/4.
    quality = np.array([1.0, 0.0, 0.5, 0.49])
    uncertainty = np.array([0.1, 0.4, 0.3, 0.2])
    assert roc_auc_wrong(uncertainty, quality) == pytest.approx(0.75)
    assert roc_auc_wrong(-uncertainty, quality) == pytest.approx(0.25)


def test_roc_auc_counts_ties_as_half():
    quality = np.array([1.0, 0.0])
    assert roc_auc_wrong(np.array([0.3, 0.3]), quality) == pytest.approx(0.5)


def test_accuracy_thresholds_at_one_half():
    assert accuracy(np.array([0.5, 0.49, 1.0, 0.0])) == pytest.approx(0.5)
    assert accuracy(np.array([0.5, 0.5, 0.5])) == 1.0
    assert accuracy(np.array([0.4999])) == 0.0
    assert math.isnan(accuracy(np.array([])))


def test_roc_auc_accepts_infinite_uncertainty_for_empty_answers():
    from training.rejection import roc_auc_wrong

    uncertainty = np.array([0.1, 0.2, np.inf, 0.3])
    quality = np.array([1.0, 1.0, 0.0, 0.0])
    assert roc_auc_wrong(uncertainty, quality) == 1.0


def test_paired_bootstrap_intervals_cover_the_estimate_and_pair_the_methods():
    from training.rejection import interval, paired_bootstrap_prr

    rng = np.random.default_rng(0)
    quality = (rng.uniform(size=400) < 0.4).astype(float)
    good = -quality + rng.normal(0, 0.5, 400)  # informative: right answers are less uncertain
    noise = rng.normal(0, 1, 400)
    samples = paired_bootstrap_prr({"good": good, "noise": noise}, quality, resamples=300, seed=1)
    low, high = interval(samples["good"])
    assert low < prediction_rejection_ratio(good, quality) < high and low > 0.2
    low_noise, high_noise = interval(samples["noise"])
    assert low_noise < 0 < high_noise
    difference_low, _ = interval(samples["good"] - samples["noise"])
    assert difference_low > 0  # paired: the informative score wins on (almost) every resample
