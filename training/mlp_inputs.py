"""Standardised inputs for the stage-2 MLP, folded into its first layer afterwards.

TAD's attention columns differ in scale by orders of magnitude (a head that attends to the
sink token holds values near 0 for every generated key, another spreads its mass over
them), and the paper's MLP grid trains with learning rates of 1e-5..5e-5 for 10-30 epochs.
Fitting on columns scaled to unit variance lets every column move the first layer alike.
The scaling is then folded into the first layer, `((x - m) / s) W + b = x (W / s) + (b - (m / s) W)`,
so the installed network is a plain `MLPRegressor` on raw features: serving, the recurrent
split of its first layer (app/uncertainty/tad.py) and the artifact format are unchanged.
Measured on the default artifact's configuration it ranks answers worse than raw inputs at the
paper's learning rate (README, "Standardised MLP inputs, measured and not kept"): an option, off
by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.neural_network import MLPRegressor

# Columns whose standard deviation is below MIN_SCALE, or below RELATIVE_MIN_SCALE times their mean's size, are
# treated as constant (a float32 column that never moves) and only centred: dividing by a
# deviation that is rounding noise would fold weights of 1e6 and more into the first layer.
MIN_SCALE = 1e-8
RELATIVE_MIN_SCALE = 1e-6


@dataclass(frozen=True)
class ColumnScaling:
    """Per-column mean and scale of a design matrix (float64)."""

    mean: np.ndarray
    scale: np.ndarray

    @classmethod
    def of(cls, features: np.ndarray, chunk_rows: int = 65536) -> ColumnScaling:
        """Unweighted mean and standard deviation of each column, in two passes over chunks in float64 (the
        design matrix is float32 and may hold hundreds of thousands of rows; one pass of E[x^2] - E[x]^2
        cancels). Both are rounded to float32, the precision `apply` computes in, so the fold undoes exactly
        the scaling the network was fitted on."""
        if len(features) == 0:
            raise ValueError("no rows to standardise")
        chunks = range(0, len(features), chunk_rows)
        total = np.zeros(features.shape[1])
        for start in chunks:
            total += np.asarray(features[start : start + chunk_rows], dtype=np.float64).sum(axis=0)
        mean = total / len(features)
        squares = np.zeros(features.shape[1])
        for start in chunks:
            squares += np.square(np.asarray(features[start : start + chunk_rows], dtype=np.float64) - mean).sum(axis=0)
        scale = np.sqrt(squares / len(features))
        constant = scale < np.maximum(MIN_SCALE, RELATIVE_MIN_SCALE * np.abs(mean))
        return cls(
            mean=mean.astype(np.float32).astype(np.float64),
            scale=np.where(constant, 1.0, scale).astype(np.float32).astype(np.float64),
        )

    def apply(self, features: np.ndarray) -> np.ndarray:
        """The standardised matrix in the features' dtype (a new array)."""
        dtype = features.dtype
        return ((features - self.mean.astype(dtype)) / self.scale.astype(dtype)).astype(dtype, copy=False)


def fold_into_first_layer(model: MLPRegressor, scaling: ColumnScaling) -> MLPRegressor:
    """Turn a network fitted on `scaling.apply(x)` into the same function of x, in place."""
    weights = np.asarray(model.coefs_[0], dtype=np.float64)
    scaled_weights = weights / scaling.scale[:, None]
    model.intercepts_[0] = (model.intercepts_[0] - (scaling.mean / scaling.scale) @ weights).astype(
        model.intercepts_[0].dtype
    )
    model.coefs_[0] = scaled_weights.astype(model.coefs_[0].dtype)
    return model
