"""`evaluate`: PRR and ROC-AUC of TAD and the baselines per dataset, a markdown table, rejection-curve plots."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.numeric import finite_or_none
from app.uncertainty.artifact import TadArtifact, load_artifact
from app.uncertainty.methods import METHODS
from training.rejection import (
    accuracy,
    oracle_curve,
    prediction_rejection_ratio,
    rejection_curve,
    roc_auc_wrong,
)
from training.run_source import RunSource, obtain_run
from training.runs import TextTrace, iter_texts
from training.scoring import uncertainty_table

logger = logging.getLogger(__name__)

REPORT_METHODS = tuple(method.name for method in METHODS)


def group_by_dataset(texts: Sequence[TextTrace]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for index, text in enumerate(texts):
        groups.setdefault(text.dataset, []).append(index)
    return groups


OVERALL = "overall"


def _entry(table: dict[str, np.ndarray], quality: np.ndarray, indices: list[int]) -> dict[str, Any]:
    return {
        "n": len(indices),
        "accuracy": finite_or_none(accuracy(quality)),
        "mean_quality": finite_or_none(float(quality.mean())),
        "methods": {
            method: {
                "prr": finite_or_none(prediction_rejection_ratio(values[indices], quality)),
                "roc_auc": finite_or_none(roc_auc_wrong(values[indices], quality)),
            }
            for method, values in table.items()
        },
    }


def build_report(artifact: TadArtifact, texts: Sequence[TextTrace]) -> tuple[dict[str, Any], dict[str, Any]]:
    """report.json content (per dataset, plus all texts pooled under "overall"), and the arrays for plots."""
    table = uncertainty_table(artifact, texts)
    targets = np.array([t.target for t in texts])
    report: dict[str, Any] = {"datasets": {}}
    arrays: dict[str, Any] = {}
    groups = group_by_dataset(texts)
    for name, indices in groups.items():
        report["datasets"][name] = _entry(table, targets[indices], indices)
        arrays[name] = {"quality": targets[indices], "uncertainty": {m: v[indices] for m, v in table.items()}}
    if len(groups) > 1:
        everything = list(range(len(texts)))
        report[OVERALL] = _entry(table, targets, everything)
        arrays[OVERALL] = {"quality": targets, "uncertainty": table}
    report["artifact"] = {
        "path": str(artifact.path),
        "variant": artifact.manifest.variant,
        "aggregation": artifact.manifest.aggregation.value,
    }
    return report, arrays


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def report_markdown(report: dict[str, Any]) -> str:
    """Two tables, PRR then ROC-AUC: rows are datasets (and all pooled), columns methods."""
    extra = sorted({m for d in report["datasets"].values() for m in d["methods"] if m not in REPORT_METHODS})
    methods = [*REPORT_METHODS, *extra]
    rows = list(report["datasets"].items()) + ([(f"*{OVERALL}*", report[OVERALL])] if OVERALL in report else [])
    sections = []
    for metric, title in (("prr", "PRR at 50% rejection (1 = oracle, 0 = random)"), ("roc_auc", "ROC-AUC")):
        lines = [
            f"{title}:",
            "",
            "| dataset | n | accuracy | " + " | ".join(methods) + " |",
            "|---|---|---|" + "---|" * len(methods),
        ]
        for name, entry in rows:
            values = " | ".join(_fmt(entry["methods"][m][metric]) for m in methods)
            lines.append(f"| {name} | {entry['n']} | {_fmt(entry['accuracy'])} | {values} |")
        sections.append("\n".join(lines))
    return "\n\n".join(sections) + "\n"


def plot_curves(name: str, arrays: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quality = arrays["quality"]
    figure, axes = plt.subplots(figsize=(6, 4))
    grid = None
    for method in REPORT_METHODS:
        grid, curve = rejection_curve(arrays["uncertainty"][method], quality)
        axes.plot(grid, curve, label=method)
    grid, oracle = oracle_curve(quality, grid)
    axes.plot(grid, oracle, "k--", label="oracle")
    axes.plot(grid, np.full_like(grid, quality.mean()), "k:", label="random")
    axes.set_xlabel("rejection rate")
    axes.set_ylabel("mean quality of kept answers")
    axes.set_title(f"{name}: rejection curves (n={len(quality)})")
    axes.legend(loc="best", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def run_evaluate(artifact_dir: Path, source: RunSource, out: Path) -> dict[str, Any]:
    artifact = load_artifact(artifact_dir)
    run = obtain_run(source, artifact)
    texts = list(iter_texts([run]))
    report, arrays = build_report(artifact, texts)
    report["run"] = str(run)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(report_markdown(report))
    for name, data in arrays.items():
        plot_curves(name, data, out / f"rejection_{name}.png")
    return report
