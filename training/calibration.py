"""Choosing reject thresholds on calibration data (accept an answer when U <= threshold).

- Target coverage c: the empirical quantile that accepts a share c of calibration answers.
- Target error rate a among accepted answers, with a finite-sample guarantee: Learn then
  Test (Angelopoulos et al., 2021) with fixed-sequence testing. The calibration set is
  split at random in two halves. Half A fixes the order of candidate thresholds
  (ascending, starting where A accepts enough answers for a test to have any power);
  half B tests H(t): "error among accepted > a" for each candidate in that order with the
  exact binomial p-value P(Bin(n_t, a) <= k_t) and stops at the first it cannot reject.
  The largest rejected threshold is returned. Because the order does not depend on B,
  with probability at least 1 - delta over the calibration sample the error rate among
  accepted answers at that threshold is at most a (for exchangeable data). If no
  threshold passes, the target is infeasible at this sample size and none is written.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import binom

from app.uncertainty.artifact import Threshold
from training.metrics import CORRECT_THRESHOLD


def coverage_name(coverage: float) -> str:
    return f"coverage@{coverage:g}"


def error_name(error: float) -> str:
    return f"error@{error:g}"


def _achieved(uncertainty: np.ndarray, wrong: np.ndarray, threshold: float) -> tuple[float, float]:
    accepted = uncertainty <= threshold
    coverage = float(accepted.mean()) if len(accepted) else 0.0
    error = float(wrong[accepted].mean()) if accepted.any() else 0.0
    return coverage, error


def coverage_threshold(uncertainty: np.ndarray, quality: np.ndarray, coverage: float) -> Threshold:
    """The threshold accepting the `coverage` share of most confident calibration answers."""
    finite = np.sort(uncertainty[np.isfinite(uncertainty)])
    count = math.floor(coverage * len(uncertainty))
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
    u_a, u_b, wrong_b = uncertainty[half_a], uncertainty[half_b], wrong[half_b]
    # A test of n accepted answers with no error can only reject when (1 - a)^n <= delta.
    min_accepted = math.ceil(math.log(delta) / math.log1p(-max_error)) if max_error < 1 else 1
    candidates = np.unique(u_a[np.isfinite(u_a)])
    accepted_in_a = np.searchsorted(np.sort(u_a), candidates, side="right")
    candidates = candidates[accepted_in_a >= min(min_accepted, len(u_a))]
    sorted_b = np.argsort(u_b, kind="stable")
    u_b_sorted, wrong_b_sorted = u_b[sorted_b], wrong_b[sorted_b].astype(int)
    errors_cumulative = np.concatenate([[0], np.cumsum(wrong_b_sorted)])
    chosen: float | None = None
    for threshold in candidates:
        accepted = int(np.searchsorted(u_b_sorted, threshold, side="right"))
        if accepted == 0:
            break
        errors = int(errors_cumulative[accepted])
        if binom.cdf(errors, accepted, max_error) > delta:
            break
        chosen = float(threshold)
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
