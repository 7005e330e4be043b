"""How much each training text weighs in the regressors' least squares (`fit` chooses by CV).

TAD's regressors are fitted on token rows, every row with its text's target, while every
decision and every PRR is per text. Unweighted, a 64-token chat answer (63 rows) counts
about 30 times as much as a 3-token task answer (2 rows), so the fit is mostly about long
answers and about which tokens of them are typical. Text weighting gives every row of text k the weight
`mean_rows / rows_k` (`mean_rows` over the texts given, those with at least one row): each
text then counts equally, and the total weight is the number of rows of the texts given (of a
CV training fold, about that), so the ridge penalty keeps its scale and one alpha grid serves
both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from enum import StrEnum

import numpy as np

from training.two_stage import FitText


class RowWeighting(StrEnum):
    TOKEN = "token"  # every token row weighs 1 (the paper)
    TEXT = "text"  # every text weighs the same, spread over its rows


def weighted(texts: Sequence[FitText], weighting: RowWeighting) -> list[FitText]:
    """The texts with the row weights of `weighting` (texts without a row weigh nothing anyway)."""
    rows = np.array([max(len(t) - 1, 0) for t in texts], dtype=np.float64)
    if weighting is RowWeighting.TOKEN or not rows.any():
        return [t if t.row_weight == 1.0 else replace(t, row_weight=1.0) for t in texts]
    mean_rows = float(rows[rows > 0].mean())
    return [replace(t, row_weight=mean_rows / n if n else 1.0) for t, n in zip(texts, rows, strict=True)]
