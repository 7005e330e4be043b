"""Uncertainty scores of stored answers: each registered method's (TAD's from an artifact, and the free
baselines'), computed by the same code the server runs.

Not the answers' quality targets, which are scored against the references in training/targets.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from app.uncertainty.aggregation import Aggregation, aggregate
from app.uncertainty.artifact import TadArtifact, load_listed
from app.uncertainty.methods import BASELINES, METHODS, REGISTRY, MethodInput
from app.uncertainty.tad import TadScorer
from app.uncertainty.trace import TokenTrace
from training.runs import TextTrace

# An empty answer has no score; for ranking it counts as maximally uncertain.
EMPTY_ANSWER_UNCERTAINTY = math.inf


def ranked(value: float | None) -> float:
    """A score as rankings use it: undefined (empty answer) sorts as most uncertain."""
    return EMPTY_ANSWER_UNCERTAINTY if value is None or math.isnan(value) else float(value)


def alternative_scorers(artifact: TadArtifact) -> dict[str, tuple[TadScorer, Aggregation]]:
    """The artifact's own regressor and the alternative variant's, keyed `tad_<variant>`.

    Each alternative is unpickled from the bytes its listed sha256 is checked on (`load_listed`).
    """
    manifest = artifact.manifest
    if not artifact.has_regressor:
        return {}
    trained = artifact.trained()
    scorers = {f"tad_{trained.variant}": (trained.tad, trained.aggregation)}
    for variant, info in manifest.metrics.get("alternatives", {}).items():
        path = Path(artifact.path) / info["file"]
        if info["file"] in manifest.files and path.is_file():
            regressor = load_listed(Path(artifact.path), manifest, info["file"])
            scorer = TadScorer(regressor=regressor, spec=trained.spec, epsilon=trained.epsilon)
            scorers[f"tad_{variant}"] = (scorer, Aggregation(info["aggregation"]))
    return scorers


def baseline_table(traces: Sequence[TokenTrace]) -> dict[str, np.ndarray]:
    """Per baseline method (every registered method that needs no artifact), each answer's score."""
    return {
        method.value: np.array([ranked(REGISTRY[method.value](MethodInput(trace=t))) for t in traces])
        for method in BASELINES
    }


def artifact_methods(artifact: TadArtifact) -> list[str]:
    """The registered methods the artifact can score (TAD only with a regressor)."""
    return [m.name for m in METHODS if not m.needs_check_pass and (not m.needs_regressor or artifact.has_regressor)]


def uncertainty_table(artifact: TadArtifact, texts: Sequence[TextTrace]) -> dict[str, np.ndarray]:
    """Per method the artifact can score (and per stored TAD variant, `tad_<variant>`), each text's uncertainty."""
    n_lags = artifact.n_lags
    scorers = alternative_scorers(artifact)
    main = f"tad_{artifact.manifest.variant}" if artifact.has_regressor else None
    methods = artifact_methods(artifact)
    table: dict[str, list[float]] = {name: [] for name in [*methods, *scorers]}
    # Every stored TAD variant on every answer: minutes for a few thousand answers on CPU.
    for text in tqdm(texts, desc="scoring answers", unit="answer", leave=False):
        trace = text.token_trace(n_lags)
        confidences = {
            name: scorer.confidences_of(trace) if len(trace) else np.zeros(0) for name, (scorer, _) in scorers.items()
        }
        for name, (_, aggregation) in scorers.items():
            table[name].append(ranked(aggregate(confidences[name], aggregation)))
        answer = MethodInput(
            trace=trace,
            tad_confidences=confidences[main] if main is not None else None,
            tad_aggregation=artifact.manifest.aggregation,
        )
        for name in methods:
            table[name].append(ranked(REGISTRY[name](answer)))
    return {name: np.array(values, dtype=np.float64) for name, values in table.items()}
