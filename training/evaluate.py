"""`evaluate` and `calibrate`: score a run with an artifact; report PRR/ROC-AUC; choose thresholds."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.uncertainty.artifact import Manifest, TadArtifact, load_artifact, write_manifest
from app.uncertainty.scores import Method
from training.calibration import coverage_name, coverage_threshold, error_name, error_threshold
from training.generate import GenerateOptions, run_generate
from training.metrics import (
    accuracy,
    oracle_curve,
    prediction_rejection_ratio,
    rejection_curve,
    roc_auc_wrong,
)
from training.runs import TextTrace, iter_texts, read_run_settings
from training.scoring import uncertainty_table

logger = logging.getLogger(__name__)

REPORT_METHODS = ("tad", "msp", "perplexity", "mean_token_entropy")


@dataclass(frozen=True)
class RunSource:
    """Where the traces come from: an existing run, or a new (resumable) one generated here."""

    data: Sequence[Path]
    run: Path | None
    default_run_dir: Path
    model: str | None = None
    limit: int | None = None
    batch_size: int = 8
    max_new_tokens: int | None = None
    device: str = "auto"
    cache_dir: Path | None = None


def obtain_run(source: RunSource, artifact: TadArtifact) -> Path:
    if source.run is not None:
        settings = read_run_settings(source.run)
        if settings["model_sha256"] != artifact.manifest.llm.sha256:
            raise SystemExit(f"run {source.run} was generated with another model than the artifact's")
        if settings["n_lags"] < artifact.n_lags:
            raise SystemExit(f"run {source.run} stores {settings['n_lags']} lags; the artifact needs {artifact.n_lags}")
        return source.run
    if not source.data:
        raise SystemExit("give --data files to generate from, or --run to reuse a run")
    options = GenerateOptions(
        data=source.data,
        out=source.default_run_dir,
        model=source.model or artifact.manifest.llm.source,
        n_lags=artifact.n_lags,
        limit=source.limit,
        max_new_tokens=source.max_new_tokens,
        batch_size=source.batch_size,
        device=source.device,
        cache_dir=source.cache_dir,
    )
    return run_generate(options)


def group_by_dataset(texts: Sequence[TextTrace]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for index, text in enumerate(texts):
        groups.setdefault(text.dataset, []).append(index)
    return groups


def _finite(value: float) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def build_report(artifact: TadArtifact, texts: Sequence[TextTrace]) -> tuple[dict[str, Any], dict[str, Any]]:
    """report.json content, and the per-dataset arrays the plots need."""
    table = uncertainty_table(artifact, texts)
    targets = np.array([t.target for t in texts])
    report: dict[str, Any] = {"datasets": {}}
    arrays: dict[str, Any] = {}
    groups = group_by_dataset(texts)
    if len(groups) > 1:
        groups["all"] = list(range(len(texts)))
    for name, indices in groups.items():
        quality = targets[indices]
        methods = {
            method: {
                "prr": _finite(prediction_rejection_ratio(values[indices], quality)),
                "roc_auc": _finite(roc_auc_wrong(values[indices], quality)),
            }
            for method, values in table.items()
        }
        report["datasets"][name] = {
            "n": len(indices),
            "accuracy": _finite(accuracy(quality)),
            "mean_quality": _finite(float(quality.mean())),
            "methods": methods,
        }
        arrays[name] = {"quality": quality, "uncertainty": {m: v[indices] for m, v in table.items()}}
    report["artifact"] = {
        "path": str(artifact.path),
        "variant": artifact.manifest.variant,
        "aggregation": artifact.manifest.aggregation.value,
    }
    return report, arrays


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def report_markdown(report: dict[str, Any]) -> str:
    extra = sorted(
        {m for d in report["datasets"].values() for m in d["methods"] if m not in REPORT_METHODS},
    )
    methods = [*REPORT_METHODS, *extra]
    lines = [
        "| dataset | n | accuracy | "
        + " | ".join(f"{m} PRR" for m in methods)
        + " | "
        + " | ".join(f"{m} ROC-AUC" for m in methods)
        + " |",
        "|" + "---|" * (3 + 2 * len(methods)),
    ]
    for name, entry in report["datasets"].items():
        prr = [_fmt(entry["methods"][m]["prr"]) for m in methods]
        auc = [_fmt(entry["methods"][m]["roc_auc"]) for m in methods]
        lines.append(
            f"| {name} | {entry['n']} | {_fmt(entry['accuracy'])} | " + " | ".join(prr) + " | " + " | ".join(auc) + " |"
        )
    return "\n".join(lines) + "\n"


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
