"""`lodo`: leave one dataset out, the paper's generalization table.

For every dataset, TAD is fitted (with the artifact's configuration: convention, variant,
both alphas, aggregation, target centring, row weighting) on the training texts of all
*other* datasets and scored on that dataset's test texts, beside the baselines, with paired
bootstrap 95% intervals.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from app.numeric import finite_or_none
from app.uncertainty.aggregation import aggregate
from app.uncertainty.artifact import load_artifact
from app.uncertainty.methods import Method
from app.uncertainty.tad import TadScorer
from training.commands.fit import Choice, FitOptions, fit_final, load_runs, prepare_folds
from training.groups import TargetCentring, centred
from training.rejection import (
    INFORMATIVE_ACCURACY,
    accuracy,
    informative,
    interval,
    paired_bootstrap_prr,
    prediction_rejection_ratio,
)
from training.runs import iter_texts
from training.scoring import baseline_table, ranked
from training.two_stage import Variant
from training.weighting import RowWeighting, weighted

logger = logging.getLogger(__name__)


def run_lodo(
    train_runs: Sequence[Path],
    test_runs: Sequence[Path],
    artifact_dir: Path,
    out: Path,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    artifact = load_artifact(artifact_dir)
    manifest = artifact.manifest
    spec, epsilon, aggregation = artifact.scorer.spec, manifest.epsilon, manifest.aggregation
    params = manifest.regressor.params
    variant = Variant("algorithm1-literal" if manifest.variant == "paper-exact" else manifest.variant)
    choice = Choice(variant, float(params.get("alpha_stage1", params["alpha"])), float(params["alpha"]))
    centring = TargetCentring(params.get("target_centring", TargetCentring.NONE.value))
    weighting = RowWeighting(params.get("row_weighting", RowWeighting.TOKEN.value))
    texts, _, _ = load_runs(train_runs, spec.n_lags)
    tests = list(iter_texts(test_runs))
    datasets = sorted({t.dataset for t in tests} & {t.dataset for t in texts})
    report: dict[str, Any] = {
        "configuration": {
            "convention": spec.convention.value,
            "variant": variant.value,
            "alpha": choice.alpha,
            "alpha_stage1": choice.alpha_stage1,
            "aggregation": aggregation.value,
            "target_centring": centring.value,
            "row_weighting": weighting.value,
        },
        "datasets": {},
    }
    options = FitOptions(runs=train_runs, out=out, variants=(variant,), seed=seed)
    for dataset in tqdm(datasets, desc="lodo", unit="dataset"):
        train = weighted(centred([t for t in texts if t.dataset != dataset], centring), weighting)
        data = prepare_folds(train, spec, options)
        ((_, stage2),) = fit_final(train, spec, data, [choice], epsilon)
        scorer = TadScorer(stage2, spec, epsilon)
        held = [t for t in tests if t.dataset == dataset]
        traces = [t.token_trace(spec.n_lags) for t in held]
        quality = np.array([t.target for t in held])
        scores = baseline_table(traces)
        scores[Method.TAD.value] = np.array(
            [ranked(aggregate(scorer.confidences_of(t), aggregation)) if len(t) else np.inf for t in traces]
        )
        boot = paired_bootstrap_prr(scores, quality, resamples, seed)
        prr = {name: prediction_rejection_ratio(values, quality) for name, values in scores.items()}
        report["datasets"][dataset] = {
            "n": len(held),
            "train_texts": len(train),
            "accuracy": finite_or_none(accuracy(quality)),
            "prr": {name: finite_or_none(value) for name, value in prr.items()},
            "prr_ci95": {name: interval(values) for name, values in boot.items()},
            "tad_minus_msp": finite_or_none(prr["tad"] - prr["msp"]),
            "tad_minus_msp_ci95": interval(boot["tad"] - boot["msp"]),
        }
    differences = [
        e["tad_minus_msp"]
        for e in report["datasets"].values()
        if e["tad_minus_msp"] is not None and informative(e["accuracy"])
    ]
    report["mean_tad_minus_msp_informative"] = float(np.mean(differences)) if differences else None
    out.mkdir(parents=True, exist_ok=True)
    (out / "lodo.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "lodo.md").write_text(lodo_markdown(report))
    return report


def lodo_markdown(report: dict[str, Any]) -> str:
    methods = [m.value for m in Method]
    lines = [
        "Leave one dataset out: TAD fitted on the other datasets, PRR on this one (paired bootstrap 95%):",
        "",
        "| held-out dataset | n | accuracy | " + " | ".join(methods) + " | TAD − MSP |",
        "|---|---|---|" + "---|" * (len(methods) + 1),
    ]
    for name, entry in report["datasets"].items():
        cells = []
        for method in methods:
            value, ci = entry["prr"].get(method), entry["prr_ci95"].get(method)
            cells.append("n/a" if value is None else f"{value:.3f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""))
        diff, ci = entry["tad_minus_msp"], entry["tad_minus_msp_ci95"]
        cells.append("n/a" if diff is None else f"{diff:+.3f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""))
        accuracy_text = "n/a" if entry["accuracy"] is None else f"{entry['accuracy']:.3f}"
        lines.append(f"| {name} | {entry['n']} | {accuracy_text} | " + " | ".join(cells) + " |")
    mean = report.get("mean_tad_minus_msp_informative")
    low, high = INFORMATIVE_ACCURACY
    lines += [
        "",
        f"Mean TAD − MSP over the held-out datasets with accuracy in [{low}, {high}]: "
        + ("n/a" if mean is None else f"{mean:+.3f}"),
    ]
    return "\n".join(lines) + "\n"
