"""Scoring stored traces with an artifact, through the same code the server runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import joblib
import numpy as np

from app.uncertainty.artifact import TadArtifact
from app.uncertainty.scores import BASELINES, Aggregation, Method, aggregate, baseline_uncertainty
from app.uncertainty.tad import TadScorer
from training.runs import TextTrace


def alternative_scorers(artifact: TadArtifact) -> dict[str, tuple[TadScorer, Aggregation]]:
    """The artifact's own regressor and the alternative variant's, keyed `tad_<variant>`.

    `load_artifact` has already checked the sha256 of every listed file, alternatives included.
    """
    manifest = artifact.manifest
    scorers = {f"tad_{manifest.variant}": (artifact.scorer, manifest.aggregation)}
    for variant, info in manifest.metrics.get("alternatives", {}).items():
        path = Path(artifact.path) / info["file"]
        if info["file"] in manifest.files and path.is_file():
            scorer = TadScorer(regressor=joblib.load(path), spec=artifact.scorer.spec, epsilon=artifact.scorer.epsilon)
            scorers[f"tad_{variant}"] = (scorer, Aggregation(info["aggregation"]))
    return scorers


def uncertainty_table(artifact: TadArtifact, texts: Sequence[TextTrace]) -> dict[str, np.ndarray]:
    """Per method, the sequence uncertainty of each text (an empty answer is +inf)."""
    n_lags = artifact.n_lags
    scorers = alternative_scorers(artifact)
    table: dict[str, list[float]] = {name: [] for name in [Method.TAD.value, *[m.value for m in BASELINES], *scorers]}
    for text in texts:
        if len(text) == 0:
            for values in table.values():
                values.append(math.inf)
            continue
        attention = np.asarray(text.attention)[..., :n_lags]
        baselines = baseline_uncertainty(text.logprobs, text.entropies, None)
        for method in BASELINES:
            table[method.value].append(float(baselines.get(method)))  # type: ignore[arg-type]
        for name, (scorer, aggregation) in scorers.items():
            table[name].append(aggregate(scorer.confidences(text.logprobs, attention), aggregation))
        table[Method.TAD.value].append(table[f"tad_{artifact.manifest.variant}"][-1])
    return {name: np.array(values, dtype=np.float64) for name, values in table.items()}
