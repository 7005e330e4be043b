"""Scoring one answer: TAD's token confidences (when the artifact has a regressor) and every method's score."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.uncertainty.aggregation import Aggregation
from app.uncertainty.artifact import TadArtifact
from app.uncertainty.methods import MethodInput, SequenceUncertainty, score_all
from app.uncertainty.tad import TadStream
from app.uncertainty.trace import TokenTrace


@dataclass(frozen=True)
class ScoredAnswer:
    trace: TokenTrace
    confidences: np.ndarray | None  # TAD c_i per token; None without a regressor
    sequence: SequenceUncertainty


class AnswerScorer:
    """TAD (when the artifact has a regressor) and the baselines, for generated or given answers."""

    def __init__(self, artifact: TadArtifact | None) -> None:
        self.artifact = artifact
        self.tad = artifact.tad if artifact is not None else None  # None without a regressor

    @property
    def tad_available(self) -> bool:
        return self.tad is not None

    @property
    def aggregation(self) -> Aggregation | None:
        return self.artifact.manifest.aggregation if self.artifact else None

    def stream(self) -> TadStream | None:
        return self.tad.stream() if self.tad is not None else None

    def score(self, trace: TokenTrace, confidences: np.ndarray | None = None) -> ScoredAnswer:
        """Every method's score; `confidences` are TAD's for this trace when already known (a prefix)."""
        if self.tad is not None and confidences is None:
            if len(trace) > 0:
                confidences = self.tad.confidences_of(trace)
            else:
                confidences = np.zeros(0)
        answer = MethodInput(trace=trace, tad_confidences=confidences, tad_aggregation=self.aggregation)
        return ScoredAnswer(
            trace=trace, confidences=confidences, sequence=score_all(answer, tad_available=self.tad_available)
        )
