"""What `evaluate` reports: PRR and ROC-AUC of TAD and the baselines per dataset, a markdown table,
rejection-curve plots."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.files import write_text_atomic
from app.numeric import finite_or_none
from app.uncertainty.artifact import TadArtifact, load_artifact
from app.uncertainty.methods import BASELINES, METHODS
from training.check_pass_scores import CheckPassOptions, check_pass_methods, check_pass_table
from training.method_scores import uncertainty_table
from training.policy_outcome import default_policy_outcome, outcome_markdown
from training.rejection import (
    accuracy,
    informative,
    interval,
    mean_interval,
    oracle_curve,
    paired_bootstrap_prr,
    prediction_rejection_ratio,
    rejection_curve,
    roc_auc_wrong,
)
from training.run_source import RunSource, check_held_out, obtain_runs
from training.runs import TextTrace, check_no_duplicates, iter_texts, read_run_settings

logger = logging.getLogger(__name__)

REPORT_METHODS = tuple(method.name for method in METHODS)


def group_by_dataset(texts: Sequence[TextTrace]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for index, text in enumerate(texts):
        groups.setdefault(text.dataset, []).append(index)
    return groups


OVERALL = "overall"


COMPARED_SCORE = "tad_compared"  # another artifact's default score on the same answers (--compare-artifact)


def _entry(
    table: dict[str, np.ndarray], quality: np.ndarray, indices: list[int], resamples: int, seed: int, default: str
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """One dataset's report entry, and the bootstrap samples of the default score (`default`: the method
    the artifact decides with) minus the best baseline ("best") and minus the compared artifact's
    score ("compared"), where there are any."""
    scores = {method: values[indices] for method, values in table.items()}
    prr = {method: prediction_rejection_ratio(values, quality) for method, values in scores.items()}
    boot = paired_bootstrap_prr(scores, quality, resamples, seed) if resamples else {}
    entry: dict[str, Any] = {
        "n": len(indices),
        "accuracy": finite_or_none(accuracy(quality)),
        "mean_quality": finite_or_none(float(quality.mean())),
        "methods": {
            method: {
                "prr": finite_or_none(prr[method]),
                "prr_ci95": interval(boot[method]) if boot else None,
                "roc_auc": finite_or_none(roc_auc_wrong(values, quality)),
            }
            for method, values in scores.items()
        },
    }
    best = best_baseline(prr)
    entry["default_vs_best_baseline"] = {
        "default": default,
        "best_baseline": best,
        "difference": None if best is None else finite_or_none(prr[default] - prr[best]),
        "ci95": interval(boot[default] - boot[best]) if boot and best is not None else None,
    }
    if COMPARED_SCORE in prr:
        entry["default_vs_compared"] = {
            "difference": finite_or_none(prr[default] - prr[COMPARED_SCORE]),
            "ci95": interval(boot[default] - boot[COMPARED_SCORE]) if boot else None,
        }
    drawn = {"best": boot[default] - boot[best]} if boot and best is not None else {}
    if boot and COMPARED_SCORE in boot:
        drawn["compared"] = boot[default] - boot[COMPARED_SCORE]
    return entry, drawn


def best_baseline(prr: dict[str, float]) -> str | None:
    """The baseline with the highest PRR among those in `prr` (the comparison every report makes); None where no
    baseline's PRR is defined (every answer right, or every one wrong: no ranking to judge)."""
    defined = [m.value for m in BASELINES if m.value in prr and np.isfinite(prr[m.value])]
    return max(defined, key=lambda name: prr[name]) if defined else None


def _mean_interval(
    samples: dict[str, dict[str, np.ndarray]], chosen: list[str], key: str
) -> tuple[float, float] | None:
    """`mean_interval` over the `chosen` datasets (None unless every one has samples of `key`)."""
    drawn = [samples[name][key] for name in chosen if key in samples[name]]
    return mean_interval(drawn) if drawn and len(drawn) == len(chosen) else None


def build_report(
    artifact: TadArtifact,
    texts: Sequence[TextTrace],
    resamples: int = 1000,
    seed: int = 0,
    compared: TadArtifact | None = None,
    checked: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """report.json content (per dataset, plus all texts pooled under "overall"), and the arrays for plots.

    Each PRR comes with a paired bootstrap 95% interval over `resamples` resamples of the texts.
    `compared`: another artifact of the same model, whose default score is reported beside this
    one's (`tad_compared`) with the paired difference per dataset. `checked`: the check-pass methods'
    scores of the texts (P(True); training/check_pass_scores.py), where either artifact uses them.
    """
    table = {**uncertainty_table(artifact, texts), **(checked or {})}
    default = artifact.decision_method.value
    if compared is not None:
        table[COMPARED_SCORE] = {**uncertainty_table(compared, texts), **(checked or {})}[
            compared.decision_method.value
        ]
    targets = np.array([t.target for t in texts])
    report: dict[str, Any] = {"datasets": {}}
    arrays: dict[str, Any] = {}
    groups = group_by_dataset(texts)
    samples: dict[str, dict[str, np.ndarray]] = {}
    # A seed per dataset: the mean over datasets (mean_interval) needs their resamples independent, and one
    # seed would draw the same positions in every dataset of the same size.
    for offset, (name, indices) in enumerate(groups.items()):
        report["datasets"][name], samples[name] = _entry(
            table, targets[indices], indices, resamples, seed + offset, default
        )
        arrays[name] = {"quality": targets[indices], "uncertainty": {m: v[indices] for m, v in table.items()}}
    if len(groups) > 1:
        everything = list(range(len(texts)))
        report[OVERALL], _ = _entry(table, targets, everything, resamples, seed, default)
        arrays[OVERALL] = {"quality": targets, "uncertainty": table}
    chosen = [
        name
        for name, entry in report["datasets"].items()
        if informative(entry["accuracy"]) and entry["default_vs_best_baseline"]["difference"] is not None
    ]
    differences = [report["datasets"][name]["default_vs_best_baseline"]["difference"] for name in chosen]
    report["mean_default_minus_best_baseline_informative"] = float(np.mean(differences)) if differences else None
    report["mean_default_minus_best_baseline_informative_ci95"] = _mean_interval(samples, chosen, "best")
    report["informative_datasets"] = chosen
    if compared is not None:
        report["compared_artifact"] = str(compared.path)
        versus = [report["datasets"][name]["default_vs_compared"]["difference"] for name in chosen]
        report["mean_default_minus_compared_informative"] = (
            float(np.mean(versus)) if versus and None not in versus else None
        )
        report["mean_default_minus_compared_informative_ci95"] = _mean_interval(samples, chosen, "compared")
    if default != "tad" and "tad" in table:
        # TAD as the artifact ships it, beside the free score it decides with.
        for name in groups:
            prr = report["datasets"][name]["methods"]
            best = report["datasets"][name]["default_vs_best_baseline"]["best_baseline"]
            tad, other = prr["tad"]["prr"], None if best is None else prr[best]["prr"]
            report["datasets"][name]["tad_vs_best_baseline"] = {
                "best_baseline": best,
                "difference": None if tad is None or other is None else tad - other,
            }
    report["default_policy"] = default_policy_outcome(artifact, table, targets, groups)
    report["artifact"] = {
        "path": str(artifact.path),
        "variant": artifact.manifest.variant,
        "aggregation": artifact.manifest.aggregation.value if artifact.manifest.aggregation is not None else None,
        "decision_method": default,
    }
    return report, arrays


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _with_interval(value: float | None, ci: list[float] | tuple[float, float] | None) -> str:
    return _fmt(value) if ci is None else f"{_fmt(value)} [{ci[0]:.2f}, {ci[1]:.2f}]"


def report_markdown(report: dict[str, Any]) -> str:
    """PRR (with 95% intervals), then ROC-AUC, then the default score against the best baseline."""
    present = {m for d in report["datasets"].values() for m in d["methods"]}
    methods = [*(m for m in REPORT_METHODS if m in present), *sorted(present - set(REPORT_METHODS))]
    rows = list(report["datasets"].items()) + ([(f"*{OVERALL}*", report[OVERALL])] if OVERALL in report else [])
    sections = []
    for metric, title in (
        ("prr", "PRR at 50% rejection (1 = oracle, 0 = random), paired bootstrap 95% interval"),
        ("roc_auc", "ROC-AUC"),
    ):
        lines = [
            f"{title}:",
            "",
            "| dataset | n | accuracy | " + " | ".join(methods) + " |",
            "|---|---|---|" + "---|" * len(methods),
        ]
        for name, entry in rows:
            cells = [
                _with_interval(entry["methods"][m][metric], entry["methods"][m].get(f"{metric}_ci95")) for m in methods
            ]
            lines.append(f"| {name} | {entry['n']} | {_fmt(entry['accuracy'])} | {' | '.join(cells)} |")
        sections.append("\n".join(lines))
    names = ", ".join(report.get("informative_datasets", []))
    default = report["artifact"].get("decision_method", "tad")
    sections.append(
        _difference_section(
            report,
            rows,
            "best_baseline",
            f"Default score ({default}) minus the best baseline (chosen per dataset)",
            f"Mean over the datasets with accuracy in [0.1, 0.9] ({names})",
        )
    )
    if report.get("default_policy"):
        sections.append(outcome_markdown(report["default_policy"]))
        if calibrated_on := report.get("calibration_runs_evaluated"):
            sections.append(
                f"These answers include the artifact's calibration runs ({', '.join(calibrated_on)}): the default "
                "policy's figures are partly in sample."
            )
    if "compared_artifact" in report:
        title = f"Default score minus the compared artifact's ({report['compared_artifact']})"
        sections.append(_difference_section(report, rows, "compared", title, "Mean over the informative datasets"))
    return "\n\n".join(sections) + "\n"


def _difference_section(
    report: dict[str, Any], rows: list[tuple[str, dict[str, Any]]], against: str, title: str, mean_label: str
) -> str:
    """A table of the default score minus `against` ("best_baseline" or "compared") per dataset, and its mean."""
    named = against == "best_baseline"  # which baseline was best differs per dataset
    lines = [
        f"{title}, PRR, paired bootstrap 95%:",
        "",
        "| dataset | best baseline | difference |" if named else "| dataset | difference |",
        "|---|---|---|" if named else "|---|---|",
    ]
    for name, entry in rows:
        versus = entry.get(f"default_vs_{against}")
        if versus is not None:
            cells = [
                name,
                *([versus["best_baseline"] or "none defined"] if named else []),
                _with_interval(versus["difference"], versus["ci95"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    mean = report.get(f"mean_default_minus_{against}_informative")
    if mean is not None:
        lines += [
            "",
            f"{mean_label}: {_with_interval(mean, report.get(f'mean_default_minus_{against}_informative_ci95'))}",
        ]
    return "\n".join(lines)


def plot_curves(name: str, arrays: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quality = arrays["quality"]
    figure, axes = plt.subplots(figsize=(6, 4))
    grid = None
    for method in (m for m in REPORT_METHODS if m in arrays["uncertainty"]):
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
    staging = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # a plot killed midway is no half-written PNG
    figure.savefig(staging, dpi=100, format="png")
    plt.close(figure)
    os.replace(staging, path)


def calibration_runs_among(artifact: TadArtifact, runs: Sequence[Path]) -> list[str]:
    """Those of `runs` the artifact's thresholds were calibrated on (as its manifest names them)."""
    calibration = artifact.manifest.metrics.get("calibration", {})
    named = {Path(run).resolve() for run in calibration.get("runs", [])} if isinstance(calibration, dict) else set()
    return [str(run) for run in runs if Path(run).resolve() in named]


def run_evaluate(
    artifact_dir: Path, source: RunSource, out: Path, resamples: int = 1000, compare_dir: Path | None = None
) -> dict[str, Any]:
    artifact = load_artifact(artifact_dir)
    compared = None
    if compare_dir is not None:
        compared = load_artifact(compare_dir)
        if compared.manifest.llm.sha256 != artifact.manifest.llm.sha256:
            raise SystemExit(f"--compare-artifact {compare_dir} was trained for a different model than {artifact_dir}")
        if compared.manifest.dtype != artifact.manifest.dtype:  # the runs are the artifact's dtype (run_source.py)
            raise SystemExit(
                f"--compare-artifact {compare_dir} was trained on answers in {compared.manifest.dtype}, {artifact_dir} "
                f"on answers in {artifact.manifest.dtype}: one set of runs cannot be scored fairly by both"
            )
    runs = obtain_runs(source, artifact)
    if compared is not None:
        for run in runs:
            if read_run_settings(run)["n_lags"] < compared.n_lags:
                raise SystemExit(f"run {run} stores fewer lags than --compare-artifact {compare_dir} needs")
    texts = list(iter_texts(runs))
    if not texts:
        raise SystemExit(f"the runs hold no answers ({', '.join(map(str, runs))}): nothing to evaluate")
    check_no_duplicates(t.answer_key for t in texts)
    for scored_with in (artifact, *([compared] if compared is not None else [])):
        check_held_out(scored_with, (t.key for t in texts), "evaluate on")
    methods = sorted({*check_pass_methods(artifact), *(check_pass_methods(compared) if compared else [])})
    options = CheckPassOptions(source.device, source.cache_dir)
    checked = check_pass_table(methods, runs, texts, options)
    report, arrays = build_report(artifact, texts, resamples=resamples, compared=compared, checked=checked)
    report["runs"] = [str(run) for run in runs]
    if calibrated_on := calibration_runs_among(artifact, runs):
        # Its thresholds were certified on these answers: the default policy's figures are partly in sample.
        logger.warning(
            "evaluating on the artifact's calibration runs %s: the default policy's figures are partly "
            "in sample (evaluate without them for out-of-sample ones)",
            ", ".join(calibrated_on),
        )
        report["calibration_runs_evaluated"] = calibrated_on
    out.mkdir(parents=True, exist_ok=True)
    # An earlier report goes first and report.json comes last: a report killed midway is then missing its
    # report.json, never one whose files come from two evaluations (nor curves of datasets this one lacks).
    for stale in [out / "report.json", out / "report.md", *out.glob("rejection_*.png")]:
        stale.unlink(missing_ok=True)
    for name, data in arrays.items():
        plot_curves(name, data, out / f"rejection_{name}.png")
    write_text_atomic(out / "report.md", report_markdown(report))
    write_text_atomic(out / "report.json", json.dumps(report, indent=2) + "\n")
    return report
