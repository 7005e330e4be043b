"""A sequence-level combiner over TAD and the baselines, measured out of fold (issue 9 ablation).

Inputs per answer: the paper's two aggregations (mean, sum-log) of TAD's out-of-fold token
confidences, the baselines MSP, perplexity, mean token entropy, RAUQ, and log(1 + length). A
ridge model on standardised inputs predicts the quality target; its negation is the candidate
score.
It is fitted and scored on the same outer folds as TAD (fit's `--fold-unit`), so the fold-by-fold
comparison with TAD alone is paired.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.linear_model import RidgeCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from app.uncertainty.aggregation import Aggregation, aggregate
from app.uncertainty.methods import REGISTRY, MethodInput
from app.uncertainty.trace import TokenTrace
from training.method_scores import EMPTY_ANSWER_UNCERTAINTY
from training.rejection import accuracy, informative, prediction_rejection_ratio

BASELINE_INPUTS = ("msp", "perplexity", "mean_token_entropy", "rauq")
INPUTS = ("tad_mean", "tad_sum_log", *BASELINE_INPUTS, "log_length")
ALPHAS = tuple(float(a) for a in np.logspace(-3, 3, 13))


def combiner_inputs(trace: TokenTrace, confidences: np.ndarray) -> np.ndarray:
    """One answer's inputs in `INPUTS` order (NaN where a method is undefined)."""
    answer = MethodInput(trace=trace)
    return np.array(
        [
            aggregate(confidences, Aggregation.MEAN),
            aggregate(confidences, Aggregation.SUM_LOG),
            *(REGISTRY[name](answer) for name in BASELINE_INPUTS),
            math.log1p(len(trace)),
        ],
        dtype=np.float64,
    )


def _filled(features: np.ndarray, means: np.ndarray) -> np.ndarray:
    """Undefined inputs (e.g. RAUQ of a one-token answer without rows) take the training mean."""
    return np.where(np.isfinite(features), features, means)


@dataclass(frozen=True)
class CombinerResult:
    fold_prr: list[float]  # the combiner's PRR on each held-out fold
    scores: np.ndarray  # its out-of-fold uncertainty per text
    coefficients: dict[str, float]  # of a model fitted on every text (standardised inputs), for the report
    alpha: float

    def summary(self) -> dict[str, Any]:
        return {
            "inputs": list(INPUTS),
            "prr_mean": float(np.nanmean(self.fold_prr)),
            "prr_folds": self.fold_prr,
            "alpha": self.alpha,
            "coefficients": self.coefficients,
        }


def _fit(features: np.ndarray, targets: np.ndarray) -> Any:
    means = np.nanmean(features, axis=0)
    model = make_pipeline(StandardScaler(), RidgeCV(alphas=ALPHAS))
    model.fit(_filled(features, means), targets)
    return model, means


def cross_validate_combiner(
    features: np.ndarray,
    targets: np.ndarray,
    fold_of: np.ndarray,
    fold_metric: Callable[[np.ndarray, np.ndarray], float],
) -> CombinerResult:
    """Out-of-fold combiner scores on the given folds (`features` themselves out of fold).

    `targets` are what the ridge learns (centred ones, when the fit centres); `fold_metric(scores,
    held_mask)` scores a held-out fold against the measured quality, which may differ from them.
    """
    scores = np.full(len(targets), math.nan)
    empty = np.all(~np.isfinite(features[:, :-1]), axis=1)
    fold_prr = []
    for fold in np.unique(fold_of):
        held = fold_of == fold
        model, means = _fit(features[~held], targets[~held])
        scores[held] = -model.predict(_filled(features[held], means))
        scores[held & empty] = EMPTY_ANSWER_UNCERTAINTY
        fold_prr.append(fold_metric(scores[held], held))
    model, _ = _fit(features, targets)
    ridge = model[-1]
    return CombinerResult(
        fold_prr=fold_prr,
        scores=scores,
        coefficients=dict(zip(INPUTS, (float(c) for c in ridge.coef_), strict=True)),
        alpha=float(ridge.alpha_),
    )


def per_dataset_prr(
    scores: dict[str, np.ndarray], targets: np.ndarray, datasets: Sequence[str]
) -> dict[str, dict[str, float]]:
    """PRR of each score per dataset, with the dataset's accuracy and size."""
    names = np.array(datasets)
    table: dict[str, dict[str, float]] = {}
    for dataset in sorted(set(datasets)):
        mask = names == dataset
        row: dict[str, float] = {"n": int(mask.sum()), "accuracy": accuracy(targets[mask])}
        for name, values in scores.items():
            row[name] = prediction_rejection_ratio(values[mask], targets[mask])
        table[dataset] = row
    return table


def informative_mean(table: dict[str, dict[str, float]], name: str) -> float:
    """Mean PRR of one score over the datasets whose accuracy is informative (docs/method.md §6)."""
    values = [row[name] for row in table.values() if informative(row["accuracy"]) and math.isfinite(row[name])]
    return float(np.mean(values)) if values else math.nan
