"""Choosing reject thresholds on calibration data (accept an answer when U <= threshold).

- Target coverage c: the empirical quantile that accepts a share c of calibration answers.
- Target error rate a among accepted answers, with a finite-sample guarantee: Learn then
  Test (Angelopoulos et al., 2021) with fixed-sequence testing. The calibration set is
  split at random in two halves. Half A fixes the order of the candidate thresholds (its
  own values), most promising first: by the binomial p-value of H(t) on A. Half B then
  tests H(t): "error among accepted > a" in that order with the exact binomial p-value
  P(Bin(n_t, a) <= k_t), stopping at the first it cannot reject at level delta; the
  largest threshold rejected so far is returned. Because the order does not depend on
  B, with probability at least 1 - delta over the calibration sample the error rate among
  accepted answers at that threshold is at most a (for exchangeable data). If none
  passes, the target is infeasible at this sample size and no threshold is written.
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


def error_threshold(
    uncertainty: np.ndarray, quality: np.ndarray, max_error: float, delta: float = 0.05, seed: int = 0
) -> Threshold | None:
    """Learn-then-Test threshold for `max_error` among accepted answers, or None if infeasible."""
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
    chosen = max(passed) if passed else None
    if chosen is None:
        return None
    achieved_coverage, achieved_error = _achieved(uncertainty, wrong, chosen)
    return Threshold(
        threshold=chosen,
        kind="error",
        target=max_error,
        coverage=achieved_coverage,
        error=achieved_error,
        n=n,
        guarantee=(
            f"P(error rate among accepted <= {max_error:g}) >= {1 - delta:g} over the calibration sample "
            f"(Learn-then-Test, fixed-sequence binomial tests, n={n}, split in halves, seed {seed})"
        ),
    )
