"""The decision score: TAD blended with free baselines, each standardised (docs/method.md §5).

TAD's regressor is fitted on token rows pooled over every kind of question, so it learns what
separates right from wrong answers on average; within one kind of question the unsupervised
scores (perplexity, entropy, RAUQ) still rank some answers that TAD does not. A fixed linear
blend of standardised scores, `sum_k w_k (u_k - mean_k) / scale_k`, keeps TAD's between-task
level and adds their within-task signal. `python -m training blend` chooses the components and
weights on answers the regressor was not fitted on, by within-group PRR; the artifact stores
them, and the blend is the registered method `tad_blend`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class BlendTerm:
    method: str  # a registered method's name
    weight: float
    mean: float  # of the method's scores on the answers the blend was chosen on
    scale: float  # their standard deviation (> 0)


@dataclass(frozen=True)
class Blend:
    terms: tuple[BlendTerm, ...]

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(term.method for term in self.terms)

    def score(self, values: Mapping[str, float | None]) -> float:
        """The blended uncertainty; NaN when a term is undefined (an empty answer has no score)."""
        total = 0.0
        for term in self.terms:
            value = values.get(term.method)
            if value is None or not math.isfinite(value):
                return math.nan
            total += term.weight * (value - term.mean) / term.scale
        return total
