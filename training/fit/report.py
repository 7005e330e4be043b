"""The cross-validation record of a fit: written whole to the artifact's `report/cv.json`, summarised in its
manifest.

The record (every candidate's held-out PRR per fold, the baselines, each convention, centring and weighting
tried, the MLP grid) is what a reader of the fit wants and what the server never reads: in
the manifest, which the server parses at every start, it was most of the file (96% of the Gemma artifact's
15,193 lines). The manifest keeps what describes the served configuration: the folds, the chosen ridge row and
the best row per variant (`/info` shows both), and the served stage 2's CV PRR.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from app.files import write_text_atomic
from app.numeric import finite_tree
from app.uncertainty.artifact import Manifest
from app.uncertainty.features import Convention
from training.fit.cross_validation import SELECTION_WORDS, ConventionResult, mean_finite
from training.fit.options import FitOptions
from training.groups import Selection

CV_REPORT = Path("report") / "cv.json"
"""Where an artifact keeps its fit's cross-validation record, relative to the artifact folder."""

# What the manifest's `metrics.cv` keeps of the record, besides where the record is and the served PRR.
SUMMARY_KEYS = ("folds", "split", "seed", "selection_metric", "chosen", "best_per_variant")


def cv_record(
    options: FitOptions,
    result: ConventionResult,
    results: dict[Convention, ConventionResult],
    centrings: dict[str, Any],
    weightings: dict[str, Any],
    mlp: dict[str, Any] | None,
) -> dict[str, Any]:
    """Every number of the fit's cross-validation: `result` is the configuration kept, `results` each
    convention's first cross-validation, `centrings` and `weightings` the trial rule's record of each tried."""
    baselines = result.baselines
    return {
        "folds": options.folds,
        "split": f"by {options.fold_unit.value}",
        "seed": options.seed,
        "selection": f"mean PRR at 50% rejection over held-out folds ({SELECTION_WORDS[result.selection]})",
        "selection_metric": result.selection.value,
        "informative_groups": sorted(result.data.informative),
        "target_centring": result.centring.value,
        "centrings": centrings,
        "row_weighting": result.weighting.value,
        "weightings": weightings,
        "chosen": result.chosen_row,
        "best_per_variant": result.best,
        "convention": result.spec.convention.value,
        "conventions": {c.value: r.summary() for c, r in results.items()},
        "convention_rule": "generating unless consuming's CV PRR exceeds it by more than consuming's CV std",
        "baselines": {
            name: {
                "prr_mean": mean_finite(v),
                "prr_folds": v,
                "pooled_prr_mean": mean_finite(baselines[Selection.POOLED][name]),
                "within_group_prr_mean": mean_finite(baselines[Selection.WITHIN_GROUP][name]),
            }
            for name, v in baselines[result.selection].items()
        },
        "grid": result.table,
        "mlp": mlp,
    }


def served_row(record: dict[str, Any], kind: str) -> dict[str, Any]:
    """The record's row of the stage 2 an artifact of regressor `kind` serves."""
    if kind == "mlp":
        return dict(record["mlp"]["best"])
    if kind == "mlp+ridge":
        return dict(record["mlp"]["average"]["best"])
    return dict(record["chosen"])


def manifest_summary(record: dict[str, Any], kind: str) -> dict[str, Any]:
    """What the manifest's `metrics.cv` keeps of the record (`kind`: the manifest's regressor kind)."""
    served = served_row(record, kind)
    prr = served.get("prr_mean")
    return {
        "report": CV_REPORT.as_posix(),
        **{key: record[key] for key in SUMMARY_KEYS if key in record},
        "served": {
            "stage2": kind,
            "aggregation": served.get("aggregation"),
            "prr_mean": math.nan if prr is None else prr,
        },
    }


def write_cv_report(artifact: Path, record: dict[str, Any]) -> Path:
    """Write the record to the artifact's report/cv.json (a temporary file renamed over it: a write killed
    midway leaves the previous report whole). An undefined PRR (a fold whose answers are all right or all
    wrong) is null, as the manifest wrote it when the record was there: valid JSON for any reader."""
    path = artifact / CV_REPORT
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(finite_tree(record), indent=2, allow_nan=False) + "\n")
    return path


def read_cv_record(artifact: Path, manifest: Manifest) -> dict[str, Any]:
    """The artifact's cross-validation record: its report/cv.json; for an artifact fitted before the record
    moved there, the manifest's `metrics.cv` (then the whole record; a removed report leaves the summary)."""
    path = Path(artifact) / CV_REPORT
    if not path.is_file():
        return dict(manifest.metrics.get("cv") or {})
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise SystemExit(f"{path} is corrupt ({error.msg} at line {error.lineno})") from None
    if not isinstance(record, dict):
        raise SystemExit(f"{path} is not a cross-validation record (not a JSON object)")
    return record
