"""Which fold each training text is held out in.

A record is typically generated in two prompt styles (task and chat), and both texts carry
the record's key. Folds by record keep a question's two answers in the same fold: with folds by
text, a held-out answer's twin (same question, same knowledge the model has or lacks) is in
the training folds about four times in five, so cross-validation would measure, and select
for, questions already seen rather than the unseen questions the server gets.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import numpy as np
from sklearn.model_selection import GroupKFold, KFold

from training.two_stage import FitText


class FoldUnit(StrEnum):
    RECORD = "record"  # all texts of one record (its prompt styles) in one fold
    TEXT = "text"  # each text on its own


def fold_unit_of_split(split: str | None) -> FoldUnit:
    """The unit a CV record's `split` names ("by record", "by text"); artifacts from before
    the unit was recorded were all split by text."""
    return FoldUnit((split or "by text").removeprefix("by "))


def assign_folds(texts: Sequence[FitText], count: int, seed: int, unit: FoldUnit) -> np.ndarray:
    """`[len(texts)]` fold indices in 0..count-1, shuffled by `seed`."""
    units = len({t.key for t in texts}) if FoldUnit(unit) is FoldUnit.RECORD else len(texts)
    if units < count:
        # sklearn's own error names n_splits and n_samples, not what the user can change.
        raise SystemExit(
            f"{units} {FoldUnit(unit).value}s cannot be split into {count} folds: lower --folds or add data"
        )
    fold_of = np.zeros(len(texts), dtype=int)
    positions = np.arange(len(texts))
    if FoldUnit(unit) is FoldUnit.RECORD:
        splits = GroupKFold(n_splits=count, shuffle=True, random_state=seed).split(
            positions, groups=[t.key for t in texts]
        )
    else:
        splits = KFold(n_splits=count, shuffle=True, random_state=seed).split(positions)
    for fold, (_, held) in enumerate(splits):
        fold_of[held] = fold
    return fold_of
