"""Selective-prediction metrics: rejection curves, PRR (docs/method.md §7), ROC-AUC.

Rejection curve: texts sorted by uncertainty; rejecting the most uncertain fraction r
leaves the rest, whose mean quality is the curve's value at r. Ties in uncertainty are
resolved by expectation (the mean quality of a tied group), so a constant score is
exactly as good as random order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from sklearn.metrics import roc_auc_score

MAX_REJECTION = 0.5
GRID_POINTS = 501  # r in steps of 0.001
CORRECT_THRESHOLD = 0.5  # quality at or above which an answer counts as right
# PRR says something only where answers are neither (almost) all right nor all wrong: with
# one right answer in a hundred, a single text decides it. Summaries average over these.
INFORMATIVE_ACCURACY = (0.1, 0.9)


def informative(accuracy_value: float | None) -> bool:
    low, high = INFORMATIVE_ACCURACY
    return accuracy_value is not None and low <= accuracy_value <= high


def _tie_averaged(uncertainty: np.ndarray, quality: np.ndarray) -> np.ndarray:
    """Qualities ordered from most to least confident, tied groups replaced by their mean."""
    order = np.argsort(uncertainty, kind="stable")
    sorted_u, sorted_q = uncertainty[order], quality[order].astype(np.float64)
    _, starts, counts = np.unique(sorted_u, return_index=True, return_counts=True)
    sums = np.add.reduceat(sorted_q, starts)
    return np.repeat(sums / counts, counts)


def rejection_curve(
    uncertainty: np.ndarray, quality: np.ndarray, grid: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(rejection rates, mean quality of the kept texts) with the most uncertain rejected first."""
    uncertainty = np.asarray(uncertainty, dtype=np.float64)
    quality = np.asarray(quality, dtype=np.float64)
    if grid is None:
        grid = np.linspace(0.0, MAX_REJECTION, GRID_POINTS)
    n = len(quality)
    ordered = _tie_averaged(uncertainty, quality)
    cumulative = np.concatenate([[0.0], np.cumsum(ordered)])
    kept = np.maximum(n - np.floor(grid * n + 1e-9).astype(int), 1)
    return grid, cumulative[kept] / kept


def oracle_curve(quality: np.ndarray, grid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    return rejection_curve(-np.asarray(quality, dtype=np.float64), quality, grid)


def prediction_rejection_ratio(uncertainty: np.ndarray, quality: np.ndarray) -> float:
    """PRR over r in [0, 0.5]: 1 = oracle order, 0 = random order, < 0 = worse than random."""
    quality = np.asarray(quality, dtype=np.float64)
    if len(quality) < 2:
        return math.nan
    grid, method = rejection_curve(uncertainty, quality)
    _, oracle = oracle_curve(quality, grid)
    random = np.full_like(grid, quality.mean())
    method_area = np.trapezoid(method, grid)
    oracle_area = np.trapezoid(oracle, grid)
    random_area = np.trapezoid(random, grid)
    if oracle_area - random_area <= 1e-12:
        return math.nan
    return float((method_area - random_area) / (oracle_area - random_area))


def roc_auc_wrong(uncertainty: np.ndarray, quality: np.ndarray) -> float:
    """ROC-AUC of uncertainty separating wrong (quality < 0.5) from right answers; NaN if one class."""
    wrong = np.asarray(quality) < CORRECT_THRESHOLD
    if wrong.all() or not wrong.any():
        return math.nan
    scores = np.asarray(uncertainty, dtype=np.float64)
    finite = scores[np.isfinite(scores)]
    # Empty answers score +inf ("most uncertain"); ROC-AUC only needs the order, so place them above the rest.
    top = (finite.max() if len(finite) else 0.0) + 1.0
    scores = np.where(np.isposinf(scores), top, np.where(np.isneginf(scores), -top, scores))
    return float(roc_auc_score(wrong, scores))


def accuracy(quality: np.ndarray) -> float:
    return float(np.mean(np.asarray(quality) >= CORRECT_THRESHOLD)) if len(quality) else math.nan


def paired_bootstrap_prr(
    scores: dict[str, np.ndarray], quality: np.ndarray, resamples: int = 1000, seed: int = 0
) -> dict[str, np.ndarray]:
    """PRR of every method on the same `resamples` bootstrap resamples of the texts (paired).

    Pairing matters: two methods' intervals overlap even when one beats the other on
    almost every resample; differences must be taken resample by resample.
    """
    quality = np.asarray(quality, dtype=np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(quality), size=(resamples, len(quality)))
    return {
        name: np.array([prediction_rejection_ratio(values[draw], quality[draw]) for draw in draws])
        for name, values in scores.items()
    }


def interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float] | None:
    """Percentile interval of bootstrap samples (NaN samples, e.g. a resample with one class, left out)."""
    finite = samples[np.isfinite(samples)]
    if len(finite) == 0:
        return None
    tail = (1.0 - level) / 2.0 * 100.0
    return float(np.percentile(finite, tail)), float(np.percentile(finite, 100.0 - tail))


def mean_interval(drawn: Sequence[np.ndarray]) -> tuple[float, float] | None:
    """95% interval of a difference's mean over datasets, from each dataset's bootstrap samples of it.
    Datasets are resampled independently, so the mean's samples are theirs averaged resample by resample."""
    return interval(np.mean(np.stack(drawn), axis=0)) if len(drawn) else None
