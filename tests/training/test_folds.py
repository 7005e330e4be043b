"""Fold assignment: a record's texts in every prompt style share a fold."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from app.uncertainty.artifact import load_artifact
from tests.conftest import N_LAGS
from training.fit.cross_validation import prepare_folds
from training.fit.options import FitOptions
from training.fit.texts import load_runs
from training.folds import FoldUnit, assign_folds, fold_unit_of_split
from training.generation import GenerateOptions, run_generate
from training.tasks import PromptStyle
from training.two_stage import FitText


def _texts(records: int) -> list[FitText]:
    """Each record twice (task and chat style), the way `generate` writes both styles."""
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
        for style in ("task", "chat")
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


def test_a_manifest_split_names_its_unit() -> None:
    assert fold_unit_of_split("by record") is FoldUnit.RECORD
    assert fold_unit_of_split("by text") is FoldUnit.TEXT
    assert fold_unit_of_split(None) is FoldUnit.TEXT  # artifacts from before the unit was recorded


def test_fit_keeps_a_records_task_and_chat_answers_in_one_fold(
    tiny_runs: dict[str, Path],
    tiny_data: dict[str, list[Path]],
    tiny_model_dir: Path,
    tiny_artifact: Path,
    tmp_path: Path,
) -> None:
    chat = run_generate(
        GenerateOptions(
            data=tiny_data["train"],
            out=tmp_path / "chat",
            model=str(tiny_model_dir),
            dtype="float32",
            n_lags=N_LAGS,
            max_new_tokens=10,
            prompt_style=PromptStyle.CHAT,
        )
    )
    texts, _, _ = load_runs([tiny_runs["train"], chat], None)
    assert {t.group.split("/")[1] for t in texts} == {"task", "chat"}
    spec = load_artifact(tiny_artifact).tad.spec
    data = prepare_folds(texts, spec, FitOptions(runs=[], out=tmp_path, variants=()))
    folds = _folds_per_record(texts, data.fold_of)
    assert len(folds) == 48 and all(len(f) == 1 for f in folds)  # 48 records, each asked both ways, one fold
