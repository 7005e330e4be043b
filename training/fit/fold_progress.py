"""The MLP cross-validation resumes fold by fold: it is most of a fit (45 of the default artifact's 48 minutes).

Each finished fold's held-out PRRs are written to `<first run>/fit-progress/<key>/fold-<f>.json`, where the
key digests everything those numbers depend on: the fit's options, the stage-1 choice, the feature spec, and
each text's key, dataset, target (after centring), row weight, length and fold. Rerun, the same fit reads
the finished folds back instead of refitting them; a fit that differs in anything finds another key, so its
folds are never mixed with another's. `run_fit` removes the fit's folder once it has written its artifact.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.uncertainty.aggregation import Aggregation
from app.uncertainty.features import FeatureSpec
from training.fit.cross_validation import Choice, FoldData
from training.fit.options import FitOptions
from training.groups import Selection
from training.progress import PROGRESS_SUFFIX, ProgressStore, digest
from training.two_stage import FitText

logger = logging.getLogger(__name__)

PROGRESS_DIR = f"fit{PROGRESS_SUFFIX}"
# One fold's PRRs: by (stage-2 kind, configuration index), selection metric and aggregation.
FoldScores = dict[tuple[str, int], dict[Selection, dict[Aggregation, float]]]


def progress_root(options: FitOptions) -> Path:
    return Path(options.runs[0]) / PROGRESS_DIR


def _key(options: FitOptions, choice: Choice, spec: FeatureSpec, texts: Sequence[FitText], data: FoldData) -> str:
    described = {
        "options": options.described(),
        "choice": asdict(choice),
        "spec": asdict(spec),
    }
    return digest(
        described,
        (
            f"{text.key}\t{text.dataset}\t{text.target!r}\t{text.offset!r}\t{text.row_weight!r}\t{len(text)}\t{int(fold)}"
            for text, fold in zip(texts, data.fold_of, strict=True)
        ),
    )


class FoldProgress:
    """The finished folds of one MLP cross-validation."""

    def __init__(
        self, options: FitOptions, choice: Choice, spec: FeatureSpec, texts: Sequence[FitText], data: FoldData
    ) -> None:
        self.store = ProgressStore(progress_root(options) / _key(options, choice, spec, texts, data))

    def load(self, fold: int) -> FoldScores | None:
        """The fold's PRRs if an earlier run of this fit finished it."""
        entries = self.store.load(f"fold-{fold}")
        if entries is None:
            return None
        try:
            scores: FoldScores = {
                (entry["kind"], int(entry["config"])): {
                    Selection(metric): {Aggregation(a): float(v) for a, v in by_aggregation.items()}
                    for metric, by_aggregation in entry["prr"].items()
                }
                for entry in entries
            }
        except (ValueError, KeyError, TypeError) as error:  # a file from another version
            logger.warning(
                "fit progress of fold %d in %s unreadable (%s): it runs again", fold, self.store.folder, error
            )
            return None
        logger.info("fold %d of the MLP cross-validation read back from %s", fold, self.store.folder)
        return scores

    def save(self, fold: int, scores: FoldScores) -> None:
        entries: list[dict[str, Any]] = [
            {
                "kind": kind,
                "config": config,
                "prr": {m.value: {a.value: v for a, v in by_a.items()} for m, by_a in by_metric.items()},
            }
            for (kind, config), by_metric in scores.items()
        ]
        self.store.save(f"fold-{fold}", entries)

    def discard(self) -> None:
        """Once the artifact is written nothing resumes: the finished folds go (another fit's stay)."""
        self.store.discard()
