"""Which score an artifact decides with: the reference unless another beats it beyond the noise.

One rule for every artifact. A trained artifact's reference is TAD, compared with each free score
on the fit's cross-validation folds; a calibration-only artifact's reference is MSP, compared with
the other free scores on bootstrap resamples of its selection records. The best challenger (highest
mean within-dataset PRR) replaces the reference only when its paired interval of the gain excludes
0, at 95% over all the challenger could have been (Bonferroni: each at 1 - 0.05/K for K
challengers, since the best of K is the one tested): the shipped decision is never knowingly worse
than a free score, and never switched on a difference the data cannot tell from chance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.stats import t as student_t

LEVEL = 0.95


@dataclass(frozen=True)
class DecisionRule:
    reference: str
    challenger: str | None  # the best other score by mean PRR
    gain: float  # the challenger's mean PRR minus the reference's
    interval: tuple[float, float] | None  # paired, at `level`
    level: float  # LEVEL over the challengers it was the best of (Bonferroni)
    interval_kind: str  # "folds" (t over the CV folds) or "bootstrap" (percentiles of paired resamples)
    means: dict[str, float]

    @property
    def chosen(self) -> str:
        adopted = self.challenger is not None and self.interval is not None and self.interval[0] > 0
        return self.challenger if adopted and self.challenger is not None else self.reference

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "chosen": self.chosen}


def fold_standard_error(values: np.ndarray) -> float:
    """Standard error of the mean of per-fold values of a k-fold cross-validation, corrected for the folds'
    shared training data (Nadeau and Bengio, 2003: variance times 1/k + n_test/n_train = 1/k + 1/(k - 1)); the
    plain s/sqrt(k) treats the folds as independent and is about 1.5 times too small at k = 5."""
    k = len(values)
    return float(values.std(ddof=1) * math.sqrt(1 / k + 1 / (k - 1)))


def fold_interval(differences: Sequence[float] | np.ndarray, level: float = LEVEL) -> tuple[float, float] | None:
    """Student-t interval of the mean of per-fold differences (the folds are the paired units), with the
    corrected standard error (`fold_standard_error`)."""
    values = np.asarray(differences, dtype=np.float64)
    values = values[np.isfinite(values)]
    if len(values) < 2:
        return None
    half = float(student_t.ppf(0.5 + level / 2, len(values) - 1)) * fold_standard_error(values)
    return float(values.mean()) - half, float(values.mean()) + half


def bootstrap_interval(differences: Sequence[float] | np.ndarray, level: float = LEVEL) -> tuple[float, float] | None:
    """Percentile interval of paired bootstrap differences (NaN resamples left out)."""
    values = np.asarray(differences, dtype=np.float64)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return None
    tail = (1 - level) / 2 * 100
    return float(np.percentile(values, tail)), float(np.percentile(values, 100 - tail))


def choose(reference: str, samples: Mapping[str, Sequence[float] | np.ndarray], interval_kind: str) -> DecisionRule:
    """`samples[name]`: each score's PRR on the same paired units (folds, or bootstrap resamples), the
    reference's among them. The rule of the module docstring."""
    arrays = {name: np.asarray(values, dtype=np.float64) for name, values in samples.items()}
    means = {
        name: float(np.nanmean(values)) if np.isfinite(values).any() else math.nan for name, values in arrays.items()
    }
    others = [name for name in arrays if name != reference and math.isfinite(means[name])]
    if not others:
        return DecisionRule(reference, None, math.nan, None, LEVEL, interval_kind, means)
    challenger = max(others, key=lambda name: means[name])
    differences = arrays[challenger] - arrays[reference]
    level = 1 - (1 - LEVEL) / len(others)
    if interval_kind == "folds":
        interval = fold_interval(differences, level)
    else:
        interval = bootstrap_interval(differences, level)
    gain = means[challenger] - means[reference]
    return DecisionRule(reference, challenger, gain, interval, level, interval_kind, means)
