"""Choosing reject thresholds on calibration data (accept an answer when U <= threshold).

- Target coverage c: the empirical quantile that accepts a share c of calibration answers.
- Target error rate a among accepted answers, with a finite-sample guarantee: Learn then
  Test (Angelopoulos et al., 2021) with fixed-sequence testing, in one of two ways.

  *Natural order* (the default, `error_threshold_natural`): thresholds are ordered by
  themselves, so the whole calibration set can test them. The hypotheses are the
  thresholds accepting the 1%, 2%, ... most confident answers (fixed by the unlabelled
  scores alone), tested from the most conservative upwards, starting at the smallest
  count at which answers with half the target error would pass with 90% probability
  (fewer answers would mostly end the walk by chance); each H(t): "error among accepted > a" is tested with the exact
  binomial p-value P(Bin(n_t, a) <= k_t); the walk stops at the first it cannot reject
  at level delta and the last rejected threshold is returned.

  *Split order* (`error_threshold`): the calibration set is split at random in two
  halves. Half A fixes the order of the candidate thresholds (its own values), most
  promising first: by the binomial p-value of H(t) on A. Half B then tests the same
  H(t) in that order, stopping at the first it cannot reject at level delta; the largest
  threshold rejected so far is returned.

  Either way the order does not depend on the labels that test it, so with probability
  at least 1 - delta over the calibration sample the error rate among accepted answers at
  the returned threshold is at most a (for exchangeable data). If none passes, the target
  is infeasible at this sample size and no threshold is written.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom

from app.uncertainty.artifact import Threshold
from training.rejection import CORRECT_THRESHOLD


def coverage_name(coverage: float) -> str:
    return f"coverage@{coverage:g}"


def error_name(error: float) -> str:
    return f"error@{error:g}"


def _achieved(uncertainty: np.ndarray, wrong: np.ndarray, threshold: float) -> tuple[float, float]:
    accepted = uncertainty <= threshold
    coverage = float(accepted.mean()) if len(accepted) else 0.0
    error = float(wrong[accepted].mean()) if accepted.any() else 0.0
    return coverage, error


def _accepted_and_errors(
    uncertainty: np.ndarray, wrong: np.ndarray, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each threshold: how many answers U <= threshold accepts, and how many of those are wrong."""
    order = np.argsort(uncertainty, kind="stable")
    sorted_u = uncertainty[order]
    errors_cumulative = np.concatenate([[0], np.cumsum(wrong[order].astype(int))])
    accepted = np.searchsorted(sorted_u, thresholds, side="right")
    return accepted, errors_cumulative[accepted]


def coverage_threshold(uncertainty: np.ndarray, quality: np.ndarray, coverage: float) -> Threshold:
    """The threshold accepting the `coverage` share of most confident calibration answers."""
    finite = np.sort(uncertainty[np.isfinite(uncertainty)])
    count = math.floor(coverage * len(uncertainty) + 1e-9)
    threshold = float(finite[min(count, len(finite)) - 1]) if count > 0 and len(finite) else -math.inf
    wrong = quality < CORRECT_THRESHOLD
    achieved_coverage, achieved_error = _achieved(uncertainty, wrong, threshold)
    return Threshold(
        threshold=threshold,
        kind="coverage",
        target=coverage,
        coverage=achieved_coverage,
        error=achieved_error,
        n=len(uncertainty),
    )


GRID_STEPS = 100  # hypotheses of the natural order: coverage 1%, 2%, ..., 100%


START_POWER = 0.9


def _first_testable_count(max_error: float, delta: float, limit: int) -> int:
    """The fewest acceptances at which answers with half the target error reject H with 90% probability.

    Below it, a test fails by chance so often that it would end the walk before it starts.
    """
    for count in range(1, limit + 1):
        critical = binom.ppf(delta, count, max_error)  # largest k with P(Bin <= k) <= delta, or one above
        if binom.cdf(critical, count, max_error) > delta:
            critical -= 1
        if critical >= 0 and binom.cdf(critical, count, max_error / 2) >= START_POWER:
            return count
    return limit + 1


def error_threshold_natural(
    uncertainty: np.ndarray, quality: np.ndarray, max_error: float, delta: float = 0.05
) -> Threshold | None:
    """Learn-then-Test threshold for `max_error` with the natural order on the whole set, or None if infeasible."""
    wrong = quality < CORRECT_THRESHOLD
    n = len(uncertainty)
    finite = np.sort(uncertainty[np.isfinite(uncertainty)])
    if len(finite) == 0 or not 0 < max_error < 1:
        return None
    smallest = _first_testable_count(max_error, delta, n)
    counts = sorted({min(len(finite), max(1, round(n * step / GRID_STEPS))) for step in range(1, GRID_STEPS + 1)})
    candidates = np.unique([finite[count - 1] for count in counts if count >= smallest])
    accepted, errors = _accepted_and_errors(uncertainty, wrong, candidates)
    chosen = None
    for threshold, n_accepted, n_wrong in zip(candidates, accepted, errors, strict=True):
        if binom.cdf(n_wrong, n_accepted, max_error) > delta:
            break
        chosen = float(threshold)
    if chosen is None:
        return None
    return _certified(uncertainty, wrong, chosen, max_error, delta, "in the thresholds' natural order")


def _certified(
    uncertainty: np.ndarray, wrong: np.ndarray, threshold: float, max_error: float, delta: float, order: str
) -> Threshold:
    """The certified threshold with what it achieves on the calibration set and its guarantee in words."""
    coverage, error = _achieved(uncertainty, wrong, threshold)
    n = len(uncertainty)
    return Threshold(
        threshold=threshold,
        kind="error",
        target=max_error,
        coverage=coverage,
        error=error,
        n=n,
        guarantee=(
            f"P(error rate among accepted <= {max_error:g}) >= {1 - delta:g} over the calibration sample "
            f"(Learn-then-Test, fixed-sequence binomial tests {order}, n={n})"
        ),
    )


def out_of_sample(threshold: Threshold, uncertainty: np.ndarray, quality: np.ndarray) -> dict[str, float]:
    """Coverage and error among accepted that a threshold achieves on data it was not chosen on."""
    coverage, error = _achieved(uncertainty, quality < CORRECT_THRESHOLD, threshold.threshold)
    return {"coverage": coverage, "error": error, "n": len(uncertainty)}


def error_threshold(
    uncertainty: np.ndarray, quality: np.ndarray, max_error: float, delta: float = 0.05, seed: int = 0
) -> Threshold | None:
    """Learn-then-Test threshold for `max_error` among accepted answers (split order), or None if infeasible."""
    wrong = quality < CORRECT_THRESHOLD
    n = len(uncertainty)
    order = np.random.default_rng(seed).permutation(n)
    half_a, half_b = order[: n // 2], order[n // 2 :]
    candidates = np.unique(uncertainty[half_a][np.isfinite(uncertainty[half_a])])
    if len(candidates) == 0:
        return None
    # Order the hypotheses on half A alone: most significant (smallest binomial p-value) first,
    # larger thresholds first among equals, since they accept more.
    accepted_a, errors_a = _accepted_and_errors(uncertainty[half_a], wrong[half_a], candidates)
    p_values_a = binom.cdf(errors_a, np.maximum(accepted_a, 1), max_error)
    order_of_tests = np.lexsort((-candidates, p_values_a))
    accepted_b, errors_b = _accepted_and_errors(uncertainty[half_b], wrong[half_b], candidates)
    passed: list[float] = []
    for index in order_of_tests:
        if accepted_b[index] == 0 or binom.cdf(errors_b[index], accepted_b[index], max_error) > delta:
            break
        passed.append(float(candidates[index]))
    if not passed:
        return None
    return _certified(uncertainty, wrong, max(passed), max_error, delta, f"ordered on a random half, seed {seed}")
