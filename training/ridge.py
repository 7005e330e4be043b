"""Ridge regression from accumulated sufficient statistics.

scikit-learn's `Ridge` needs the whole design matrix in memory. TAD's stage-2 design for
10,000 texts x 100 tokens x 10,261 features is 41 GB, so features are streamed shard by
shard into `X^T X`, `X^T y` and the sums, and the same centred normal equations that
`Ridge(fit_intercept=True)` solves are solved from them. The result is returned as a
fitted `sklearn.linear_model.Ridge` (a test checks it predicts what `Ridge.fit` does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
from sklearn.linear_model import Ridge


@dataclass
class GramStats:
    """Sufficient statistics of a least-squares problem (float64)."""

    xtx: np.ndarray
    xty: np.ndarray
    sum_x: np.ndarray
    sum_y: float = 0.0
    count: float = 0.0  # total row weight (the number of rows when every weight is 1)

    @classmethod
    def zeros(cls, n_features: int) -> GramStats:
        return cls(
            xtx=np.zeros((n_features, n_features)),
            xty=np.zeros(n_features),
            sum_x=np.zeros(n_features),
        )

    @property
    def n_features(self) -> int:
        return len(self.xty)

    def add(self, features: np.ndarray, targets: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Rows with optional weights, as `Ridge.fit(sample_weight=...)` weighs them."""
        if len(features) == 0:
            return
        x = np.asarray(features, dtype=np.float64)
        y = np.asarray(targets, dtype=np.float64)
        if weights is None:
            self.xtx += x.T @ x
            self.xty += x.T @ y
            self.sum_x += x.sum(axis=0)
            self.sum_y += float(y.sum())
            self.count += len(y)
            return
        w = np.asarray(weights, dtype=np.float64)
        weighted = x * w[:, None]
        self.xtx += weighted.T @ x
        self.xty += weighted.T @ y
        self.sum_x += weighted.sum(axis=0)
        self.sum_y += float(w @ y)
        self.count += float(w.sum())

    def __add__(self, other: GramStats) -> GramStats:
        return GramStats(
            self.xtx + other.xtx,
            self.xty + other.xty,
            self.sum_x + other.sum_x,
            self.sum_y + other.sum_y,
            self.count + other.count,
        )

    def __sub__(self, other: GramStats) -> GramStats:
        return GramStats(
            self.xtx - other.xtx,
            self.xty - other.xty,
            self.sum_x - other.sum_x,
            self.sum_y - other.sum_y,
            self.count - other.count,
        )


def solve_ridge(stats: GramStats, alpha: float) -> tuple[np.ndarray, float]:
    """(coef, intercept) minimising sum_i s_i (y_i - x_i w - b)^2 + alpha ||w||^2 (s: row weights), as
    Ridge(fit_intercept=True)."""
    if stats.count == 0:
        raise ValueError("no training rows")
    mean_x = stats.sum_x / stats.count
    mean_y = stats.sum_y / stats.count
    centred_xtx = stats.xtx - stats.count * np.outer(mean_x, mean_x)
    centred_xty = stats.xty - stats.count * mean_x * mean_y
    system = centred_xtx + alpha * np.eye(stats.n_features)
    try:
        coef = scipy.linalg.solve(system, centred_xty, assume_a="pos")
    except (np.linalg.LinAlgError, scipy.linalg.LinAlgError):
        coef = scipy.linalg.lstsq(system, centred_xty)[0]
    return coef, float(mean_y - mean_x @ coef)


def as_sklearn_ridge(coef: np.ndarray, intercept: float, alpha: float) -> Ridge:
    """A fitted `Ridge` holding a solution computed from sufficient statistics."""
    model = Ridge(alpha=alpha)
    model.coef_ = np.asarray(coef, dtype=np.float64)
    model.intercept_ = float(intercept)
    model.n_features_in_ = len(coef)
    return model


def fit_ridge(stats: GramStats, alpha: float) -> Ridge:
    coef, intercept = solve_ridge(stats, alpha)
    return as_sklearn_ridge(coef, intercept, alpha)
