"""Fold assignment: a record's texts in every prompt style share a fold."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from training.folds import FoldUnit, assign_folds
from training.two_stage import FitText


def _texts(records: int) -> list[FitText]:
    """Each record twice (task and bare style), the way `generate` writes both styles."""
    empty = np.zeros(0)
    return [
        FitText(
            key=f"squad/q{i}",
            dataset="squad",
            target=float(i % 2),
            stats={},
            probs=empty,
            attention=np.zeros((0, 1, 1, 2)),
            group=f"squad/{style}",
        )
        for style in ("task", "bare")
        for i in range(records)
    ]


def _folds_per_record(texts: list[FitText], fold_of: np.ndarray) -> list[set[int]]:
    folds: dict[str, set[int]] = defaultdict(set)
    for text, fold in zip(texts, fold_of, strict=True):
        folds[text.key].add(int(fold))
    return list(folds.values())


def test_folds_by_record_keep_both_styles_of_a_question_together() -> None:
    texts = _texts(50)
    fold_of = assign_folds(texts, 5, seed=0, unit=FoldUnit.RECORD)
    assert all(len(folds) == 1 for folds in _folds_per_record(texts, fold_of))
    assert sorted(np.bincount(fold_of)) == [20] * 5  # 10 records, 20 texts per fold


def test_folds_by_text_split_twins_apart() -> None:
    texts = _texts(50)
    fold_of = assign_folds(texts, 5, seed=0, unit=FoldUnit.TEXT)
    split = sum(len(folds) == 2 for folds in _folds_per_record(texts, fold_of))
    assert split > 25  # about four in five twins land in different folds


def test_the_seed_changes_the_assignment_reproducibly() -> None:
    texts = _texts(50)
    first = assign_folds(texts, 5, seed=0, unit=FoldUnit.RECORD)
    assert np.array_equal(first, assign_folds(texts, 5, seed=0, unit=FoldUnit.RECORD))
    assert not np.array_equal(first, assign_folds(texts, 5, seed=1, unit=FoldUnit.RECORD))
