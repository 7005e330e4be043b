"""What `summary` prints: what a generation run says about the model before any uncertainty method."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from training.rejection import accuracy, informative
from training.runs import check_no_duplicates, check_run_folders, iter_texts


def summarise(runs: Sequence[Path]) -> str:
    """A markdown table per dataset: texts, accuracy, mean quality and mean answer tokens."""
    groups: dict[str, list[tuple[float, int]]] = {}
    for dataset, target, length in _answers(runs):
        groups.setdefault(dataset, []).append((target, length))
    lines = ["| dataset | texts | accuracy | mean quality | mean answer tokens |", "|---|---|---|---|---|"]
    for name, rows in sorted(groups.items()):
        quality = np.array([q for q, _ in rows])
        tokens = np.array([n for _, n in rows])
        lines.append(f"| {name} | {len(rows)} | {accuracy(quality):.3f} | {quality.mean():.3f} | {tokens.mean():.1f} |")
    return "\n".join(lines) + "\n"


def informative_datasets(runs: Sequence[Path]) -> list[str]:
    """The datasets whose accuracy in the runs lies in [0.1, 0.9]: those a PRR says something about, and those
    an artifact trains on (docs/training.md)."""
    quality: dict[str, list[float]] = {}
    for dataset, target, _ in _answers(runs):
        quality.setdefault(dataset, []).append(target)
    return sorted(name for name, values in quality.items() if informative(accuracy(np.array(values))))


def _answers(runs: Sequence[Path]) -> list[tuple[str, float, int]]:
    """(dataset, target, tokens) of every answer of the runs, each once: a mistyped path would otherwise read
    as a run with no texts (an empty table), and a run given twice (or overlapping runs) would count its
    answers twice, which can move a dataset across the informative bounds."""
    check_run_folders(runs)
    keys, answers = [], []
    for text in iter_texts(runs):
        keys.append(text.answer_key)
        answers.append((text.dataset, text.target, len(text)))
    check_no_duplicates(keys)
    return answers
