"""Turning a token trace into the service's uncertainty: token confidences and sequence scores."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.engine.sequence import TokenTrace
from app.uncertainty.artifact import TadArtifact
from app.uncertainty.scores import Aggregation, SequenceUncertainty, aggregate, baseline_uncertainty
from app.uncertainty.tad import TadStream


@dataclass(frozen=True)
class ScoredAnswer:
    trace: TokenTrace
    confidences: np.ndarray | None  # TAD c_i per token; None without an artifact
    sequence: SequenceUncertainty


class UncertaintyScorer:
    """TAD (when an artifact is loaded) and the baselines, for generated or given answers."""

    def __init__(self, artifact: TadArtifact | None) -> None:
        self.artifact = artifact

    @property
    def tad_available(self) -> bool:
        return self.artifact is not None

    @property
    def aggregation(self) -> Aggregation | None:
        return self.artifact.manifest.aggregation if self.artifact else None

    def stream(self) -> TadStream | None:
        return self.artifact.scorer.stream() if self.artifact else None

    def score(self, trace: TokenTrace) -> ScoredAnswer:
        confidences = None
        tad = None
        if self.artifact is not None and len(trace) > 0:
            confidences = self.artifact.scorer.confidences(trace.logprobs, trace.attention)
            tad = aggregate(confidences, self.artifact.manifest.aggregation)
        elif self.artifact is not None:
            confidences = np.zeros(0)
        return ScoredAnswer(
            trace=trace,
            confidences=confidences,
            sequence=baseline_uncertainty(trace.logprobs, trace.entropies, tad),
        )

    def running_tad(self, confidences: list[float]) -> float:
        """Sequence uncertainty of the tokens scored so far (for early stopping)."""
        assert self.artifact is not None
        return aggregate(np.asarray(confidences), self.artifact.manifest.aggregation)
