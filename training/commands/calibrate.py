"""`calibrate`: reject thresholds on calibration data, written into the artifact's manifest."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.uncertainty.artifact import Manifest, load_artifact, write_manifest
from app.uncertainty.methods import Method
from training.rejection import accuracy
from training.run_source import RunSource, obtain_run
from training.runs import iter_texts
from training.scoring import uncertainty_table
from training.thresholds import coverage_name, coverage_threshold, error_name, error_threshold

logger = logging.getLogger(__name__)


def run_calibrate(
    artifact_dir: Path,
    source: RunSource,
    coverages: Sequence[float],
    errors: Sequence[float],
    delta: float,
    seed: int = 0,
    default_target: str | None = None,
) -> Manifest:
    artifact = load_artifact(artifact_dir)
    run = obtain_run(source, artifact)
    texts = list(iter_texts([run]))
    table = uncertainty_table(artifact, texts)
    quality = np.array([t.target for t in texts])
    thresholds: dict[Method, dict[str, Any]] = {}
    for method in Method:
        values = table[method.value]
        entries = {coverage_name(c): coverage_threshold(values, quality, c) for c in coverages}
        for error in errors:
            chosen = error_threshold(values, quality, error, delta=delta, seed=seed)
            if chosen is None:
                logger.warning("%s: no threshold certifies error <= %g at delta %g", method.value, error, delta)
            else:
                entries[error_name(error)] = chosen
        thresholds[method] = entries
    tad = thresholds[Method.TAD]
    if default_target is not None and default_target not in tad:
        raise SystemExit(f"--default-target {default_target} was not calibrated (have: {', '.join(tad)})")
    feasible_errors = [error_name(e) for e in errors if error_name(e) in tad]
    default = default_target or (feasible_errors[0] if feasible_errors else None)
    if default is None and coverages:
        default = coverage_name(coverages[0])
    manifest = artifact.manifest.model_copy(
        update={
            "thresholds": thresholds,
            "default_target": default,
            "metrics": {
                **artifact.manifest.metrics,
                "calibration": {
                    "run": str(run),
                    "n": len(texts),
                    "delta": delta,
                    "accuracy": float(accuracy(quality)),
                },
            },
        }
    )
    return write_manifest(artifact.path, manifest)
