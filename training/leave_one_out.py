"""What `lodo` does: leave one dataset out, the paper's generalization table.

For every dataset, TAD is fitted (with the artifact's configuration: convention, variant,
both alphas, aggregation, target centring, row weighting, and the fold unit its stage-1
out-of-fold predictions were made with) on the training texts of all
*other* datasets and scored on that dataset's test texts, beside the baselines, with paired
bootstrap 95% intervals.

The same fitted model is also scored under every other aggregation (a second table), and
either alpha and the target centring can be overridden: aggregation, alphas and how much of each
dataset's offset the regressor learns are what a generalization failure would be tuned on first,
so the table shows whether any of them would have changed it.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from app.files import write_text_atomic
from app.numeric import finite_or_none
from app.uncertainty.aggregation import Aggregation, aggregate
from app.uncertainty.artifact import Manifest, TrainedTad, load_artifact
from app.uncertainty.methods import Method
from app.uncertainty.tad import AveragedRegressor, Regressor, TadScorer
from training.fit.cross_validation import Choice, fit_final, prepare_folds
from training.fit.mlp import fit_final_mlp
from training.fit.options import MLP_CONFIG_KEYS, FitOptions
from training.fit.report import read_cv_record
from training.fit.texts import load_runs
from training.folds import fold_unit_of_split
from training.groups import TargetCentring, centred
from training.method_scores import baseline_table, ranked
from training.progress import PROGRESS_SUFFIX, ProgressStore, array_digest, digest
from training.rejection import (
    INFORMATIVE_ACCURACY,
    accuracy,
    informative,
    interval,
    mean_interval,
    paired_bootstrap_prr,
    prediction_rejection_ratio,
)
from training.run_source import check_runs_match
from training.runs import TextTrace, check_no_duplicates, iter_texts
from training.two_stage import FitText, Variant
from training.weighting import RowWeighting, weighted

logger = logging.getLogger(__name__)

# Where a stopped lodo's finished held-out datasets wait for its rerun (inside --out; removed with the report).
PROGRESS_DIR = f"lodo{PROGRESS_SUFFIX}"
PROGRESS_VERSION = 1


def run_lodo(
    train_runs: Sequence[Path],
    test_runs: Sequence[Path],
    artifact_dir: Path,
    out: Path,
    resamples: int = 1000,
    seed: int = 0,
    alpha_stage1: float | None = None,
    alpha: float | None = None,
    centring: TargetCentring | None = None,
    only_datasets: Sequence[str] | None = None,
    held_out: Sequence[str] | None = None,
) -> dict[str, Any]:
    """`alpha_stage1` / `alpha` / `centring`: fit with these instead of the artifact's (None keeps the artifact's).
    `only_datasets`: train and test on these datasets alone (None: every dataset the runs hold).
    `held_out`: hold out these datasets alone, each in turn (None: every one both sides hold)."""
    artifact = load_artifact(artifact_dir)
    # Both sides must be the artifact's model with enough lags: its configuration is refitted on the
    # training runs' features and scored on the test runs' (another model's features would mean nothing).
    check_runs_match(train_runs, artifact)
    check_runs_match(test_runs, artifact)
    manifest = artifact.manifest
    trained = artifact.trained()
    spec, epsilon, aggregation = trained.spec, trained.epsilon, trained.aggregation
    params = trained.regressor.params
    variant = Variant(trained.variant)
    # An MLP's stage 2 has no alpha: the ridge's alpha below is then unused (not so for an MLP averaged with
    # a ridge, whose ridge has one).
    artifact_alpha = float(params.get("alpha", math.nan))
    kind = trained.regressor.kind
    mlp_config = {key: params[key] for key in MLP_CONFIG_KEYS} if kind in ("mlp", "mlp+ridge") else None
    # Fitted by options since removed (a mean of several seeds' MLPs; MLPs on standardised inputs): refitted
    # otherwise, the table would describe another stage 2 than the artifact's.
    if mlp_config is not None and (int(params.get("seeds", 1)) > 1 or params.get("standardised_inputs")):
        raise SystemExit(
            f"{artifact_dir}: its MLP stage 2 was fitted with fit --mlp-seeds or --mlp-standardise, which this "
            "version does not fit: refit the artifact"
        )
    if kind == "mlp" and alpha is not None:
        raise SystemExit("--alpha: the artifact's stage 2 is an MLP, which has no ridge alpha")
    if kind == "mlp+ridge" and alpha is None and math.isnan(artifact_alpha):
        raise SystemExit(f"{artifact_dir}: the manifest gives its averaged ridge no alpha (pass --alpha)")
    choice = Choice(
        variant,
        float(params.get("alpha_stage1", artifact_alpha)) if alpha_stage1 is None else alpha_stage1,
        artifact_alpha if alpha is None else alpha,
    )
    if centring is None:
        centring = TargetCentring(params.get("target_centring", TargetCentring.NONE.value))
    weighting = RowWeighting(params.get("row_weighting", RowWeighting.TOKEN.value))
    # The artifact's folds and MLP initialisation, from its cross-validation record.
    record = read_cv_record(artifact_dir, manifest)
    fold_unit = fold_unit_of_split(record.get("split"))
    texts, _, _ = load_runs(train_runs, spec.n_lags)
    tests = list(iter_texts(test_runs))
    check_no_duplicates(t.answer_key for t in tests)  # counted twice, an answer would narrow the intervals
    if only_datasets is not None:
        kept = set(only_datasets)
        if len(kept) < 2:
            raise SystemExit("--datasets: name at least two (each is fitted on the others)")
        unknown = sorted(kept - {t.dataset for t in texts})
        if unknown:
            raise SystemExit(f"--datasets: the training runs hold no {', '.join(unknown)}")
        untested = sorted(kept - {t.dataset for t in tests})
        if untested:
            logger.warning("--datasets: the test runs hold no %s; used for training only", ", ".join(untested))
        texts = [t for t in texts if t.dataset in kept]
        tests = [t for t in tests if t.dataset in kept]
    datasets = sorted({t.dataset for t in tests} & {t.dataset for t in texts})
    if len({t.dataset for t in texts}) < 2 or not datasets:
        # Each held-out dataset is fitted on the others and scored on its test answers: there must be others,
        # and a dataset both sides hold (otherwise the tables would be empty).
        raise SystemExit(
            "lodo needs training runs holding at least two datasets, and test runs holding one of them "
            f"(training: {', '.join(sorted({t.dataset for t in texts})) or 'none'}; "
            f"test: {', '.join(sorted({t.dataset for t in tests})) or 'none'})"
        )
    # A bootstrap seed per dataset, the same whichever are held out: the mean's interval (mean_interval) needs
    # the datasets' resamples independent, and one seed draws the same positions in datasets of one size.
    seed_offset = {dataset: offset for offset, dataset in enumerate(datasets)}
    if held_out is not None:
        missing = sorted(set(held_out) - set(datasets))
        if missing:
            raise SystemExit(f"--held-out: {', '.join(missing)} is not in both the training and the test runs")
        datasets = sorted(set(held_out))
    report: dict[str, Any] = {
        "configuration": {
            "convention": spec.convention.value,
            "variant": variant.value,
            "alpha": None if kind == "mlp" else choice.alpha,  # an MLP stage 2 has none
            "alpha_stage1": choice.alpha_stage1,
            "aggregation": aggregation.value,
            "target_centring": centring.value,
            "row_weighting": weighting.value,
            "fold_unit": fold_unit.value,
            "stage2": "ridge" if mlp_config is None else {"mlp": mlp_config, "width": params["width"]},
            "averaged_with_ridge": True if kind == "mlp+ridge" else None,  # None: not in the report's text
            "datasets": sorted({t.dataset for t in texts}),
        },
        # Which answers were scored: the held-out dataset's answers in every test run, its training runs' too
        # when they are among them (a refit never sees them either).
        "runs": {"train": [str(path) for path in train_runs], "test": [str(path) for path in test_runs]},
        "datasets": {},
    }
    options = FitOptions(
        runs=train_runs,
        out=out,
        variants=(variant,),
        seed=int(record.get("seed", seed)),
        fold_unit=fold_unit,
        epsilon=epsilon,
        mlp_width=int(params.get("width", FitOptions.mlp_width)),
    )
    # Each held-out dataset's refit is minutes (an MLP's): a rerun of the same lodo takes the finished ones back.
    progress = ProgressStore(
        out / PROGRESS_DIR / _progress_key(report["configuration"], options, manifest, resamples, seed, texts, tests)
    )
    drawn: list[np.ndarray] = []  # bootstrap samples of TAD - MSP of each informative held-out dataset
    for dataset in tqdm(datasets, desc="lodo", unit="dataset"):
        finished = _finished(progress.load(dataset))
        if finished is None:
            finished = _held_out(
                dataset,
                texts,
                tests,
                centring,
                weighting,
                choice,
                mlp_config,
                kind,
                options,
                trained,
                resamples,
                seed + seed_offset[dataset],
            )
            entry, samples = finished
            progress.save(dataset, {"entry": entry, "samples": None if samples is None else samples.tolist()})
        else:
            logger.info("lodo: %s read back from %s", dataset, progress.folder)
        entry, samples = finished
        report["datasets"][dataset] = entry
        if samples is not None:
            drawn.append(samples)
    report["mean_tad_minus_msp_informative"] = _informative_mean(report, lambda e: e["tad_minus_msp"])
    # Held-out datasets are resampled independently: the mean's samples are theirs averaged draw by draw.
    report["mean_tad_minus_msp_informative_ci95"] = mean_interval(drawn)
    report["mean_tad_minus_msp_informative_by_aggregation"] = {
        other.value: _informative_mean(report, _tad_minus_msp_by(other)) for other in Aggregation
    }
    out.mkdir(parents=True, exist_ok=True)
    # The markdown first, its JSON last, an earlier pair removed before: never a pair from two runs.
    (out / "lodo.json").unlink(missing_ok=True)
    write_text_atomic(out / "lodo.md", lodo_markdown(report))
    write_text_atomic(out / "lodo.json", json.dumps(report, indent=2) + "\n")
    for dataset in datasets:  # this run's; a stopped run's other datasets (under --held-out) stay
        progress.remove(dataset)
    return report


def _progress_key(
    configuration: dict[str, Any],
    options: FitOptions,
    manifest: Manifest,
    resamples: int,
    seed: int,
    texts: Sequence[FitText],
    tests: Sequence[TextTrace],
) -> str:
    """Everything a held-out dataset's entry depends on: the refit's configuration, the model and dtype, the
    bootstrap, and each training and test answer (its probabilities too: answers regenerated into the same
    runs have other numbers under the same keys)."""
    described = {
        "version": PROGRESS_VERSION,
        "configuration": configuration,
        "options": options.described(),
        "model": manifest.llm.sha256,
        "dtype": manifest.dtype,
        "features": manifest.features.model_dump(),
        "epsilon": manifest.epsilon,
        "params": manifest.regressor.params if manifest.regressor is not None else None,
        "resamples": resamples,
        "seed": seed,
    }
    lines = [f"train\t{t.key}\t{t.group}\t{t.target!r}\t{array_digest(t.probs)}" for t in texts]
    lines += [f"test\t{t.key}\t{t.group}\t{t.target!r}\t{array_digest(t.logprobs)}" for t in tests]
    return digest(described, lines)


# The keys of a held-out dataset's report entry: a saved entry without them (another version's) is refitted.
ENTRY_KEYS = frozenset({"n", "train_texts", "accuracy", "prr", "prr_ci95", "tad_minus_msp", "by_aggregation"})


def _finished(saved: Any) -> tuple[dict[str, Any], np.ndarray | None] | None:
    """A held-out dataset's entry and TAD - MSP samples as an earlier run saved them (None: not finished)."""
    if not isinstance(saved, dict) or not isinstance(saved.get("entry"), dict) or "samples" not in saved:
        return None
    if not set(saved["entry"]) >= ENTRY_KEYS:
        return None
    samples = saved["samples"]
    return saved["entry"], None if samples is None else np.asarray(samples, dtype=float)


def _held_out(
    dataset: str,
    texts: Sequence[FitText],
    tests: Sequence[TextTrace],
    centring: TargetCentring,
    weighting: RowWeighting,
    choice: Choice,
    mlp_config: dict[str, Any] | None,
    kind: str,
    options: FitOptions,
    trained: TrainedTad,
    resamples: int,
    seed: int,
) -> tuple[dict[str, Any], np.ndarray | None]:
    """Refit on the other datasets, score `dataset`'s test answers: its report entry, and its bootstrap samples
    of TAD - MSP when its accuracy is informative (None otherwise)."""
    spec, epsilon, aggregation, variant = trained.spec, trained.epsilon, trained.aggregation, Variant(trained.variant)
    train = weighted(centred([t for t in texts if t.dataset != dataset], centring), weighting)
    data = prepare_folds(train, spec, options)
    stage2: Regressor
    if mlp_config is None:
        ((_, stage2),) = fit_final(train, spec, data, [choice], epsilon)
    else:
        stage2 = fit_final_mlp(train, spec, data, variant, choice.alpha_stage1, mlp_config, options)
        if kind == "mlp+ridge":
            ((_, ridge),) = fit_final(train, spec, data, [choice], epsilon)
            stage2 = AveragedRegressor((ridge, stage2))
    scorer = TadScorer(stage2, spec, epsilon)
    held = [t for t in tests if t.dataset == dataset]
    traces = [t.token_trace(spec.n_lags) for t in held]
    quality = np.array([t.target for t in held])
    scores = baseline_table(traces)
    confidences = [scorer.confidences_of(t) if len(t) else np.zeros(0) for t in traces]
    for other in Aggregation:
        scores[aggregation_column(other, aggregation)] = np.array(
            [ranked(aggregate(c, other)) if len(c) else np.inf for c in confidences]
        )
    boot = paired_bootstrap_prr(scores, quality, resamples, seed)
    samples = (
        boot[aggregation_column(aggregation, aggregation)] - boot["msp"] if informative(accuracy(quality)) else None
    )
    prr = {name: prediction_rejection_ratio(values, quality) for name, values in scores.items()}
    columns = {other.value: aggregation_column(other, aggregation) for other in Aggregation}
    by_aggregation = {
        name: {
            "tad_minus_msp": finite_or_none(prr[column] - prr["msp"]),
            "tad_minus_msp_ci95": interval(boot[column] - boot["msp"]),
        }
        for name, column in columns.items()
    }
    entry = {
        "n": len(held),
        "train_texts": len(train),
        "accuracy": finite_or_none(accuracy(quality)),
        "prr": {name: finite_or_none(value) for name, value in prr.items()},
        "prr_ci95": {name: interval(values) for name, values in boot.items()},
        **by_aggregation[aggregation.value],  # the headline: the artifact's own aggregation
        "by_aggregation": by_aggregation,
    }
    return entry, samples


def aggregation_column(other: Aggregation, served: Aggregation) -> str:
    """The score's column: `tad` under the artifact's aggregation, `tad_<aggregation>` under the others."""
    return Method("tad").value if other is served else f"{Method('tad').value}_{other.value}"


def _signed_with_interval(difference: float | None, ci: list[float] | None) -> str:
    if difference is None:
        return "n/a"
    return f"{difference:+.3f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")


def _configuration_text(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def _tad_minus_msp_by(aggregation: Aggregation) -> Callable[[dict[str, Any]], float | None]:
    return lambda entry: entry["by_aggregation"][aggregation.value]["tad_minus_msp"]


def _informative_mean(report: dict[str, Any], difference: Callable[[dict[str, Any]], float | None]) -> float | None:
    values = [
        value
        for entry in report["datasets"].values()
        if (value := difference(entry)) is not None and informative(entry["accuracy"])
    ]
    return float(np.mean(values)) if values else None


def _runs_text(runs: dict[str, list[str]] | None) -> list[str]:
    """The lines naming the training and test runs (none for a report written before they were recorded)."""
    if runs is None:
        return []
    return [
        f"Trained on {', '.join(runs['train'])}; scored the held-out dataset's answers in {', '.join(runs['test'])}.",
        "",
    ]


def lodo_markdown(report: dict[str, Any]) -> str:
    scored = {name for entry in report["datasets"].values() for name in entry["prr"]}
    methods = [m.value for m in Method if m.value in scored]
    lines = [
        "Leave one dataset out: TAD fitted on the other datasets, PRR on this one (paired bootstrap 95%):",
        "",
        "Fit: "
        + ", ".join(
            f"{key} {_configuration_text(value)}" for key, value in report["configuration"].items() if value is not None
        ),
        "",
        *_runs_text(report.get("runs")),
        "| held-out dataset | n | accuracy | " + " | ".join(methods) + " | TAD − MSP |",
        "|---|---|---|" + "---|" * (len(methods) + 1),
    ]
    for name, entry in report["datasets"].items():
        cells = []
        for method in methods:
            value, ci = entry["prr"].get(method), entry["prr_ci95"].get(method)
            cells.append("n/a" if value is None else f"{value:.3f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""))
        cells.append(_signed_with_interval(entry["tad_minus_msp"], entry["tad_minus_msp_ci95"]))
        accuracy_text = "n/a" if entry["accuracy"] is None else f"{entry['accuracy']:.3f}"
        lines.append(f"| {name} | {entry['n']} | {accuracy_text} | " + " | ".join(cells) + " |")
    mean = report.get("mean_tad_minus_msp_informative")
    low, high = INFORMATIVE_ACCURACY
    lines += [
        "",
        f"Mean TAD − MSP over the held-out datasets with accuracy in [{low}, {high}]: "
        + _signed_with_interval(mean, report.get("mean_tad_minus_msp_informative_ci95")),
        "",
        f"TAD − MSP with the same fitted model under each aggregation (the artifact's: "
        f"{report['configuration']['aggregation']}):",
        "",
        "| held-out dataset | " + " | ".join(a.value for a in Aggregation) + " |",
        "|---|" + "---|" * len(Aggregation),
    ]
    for name, entry in report["datasets"].items():
        differences = [entry["by_aggregation"][other.value] for other in Aggregation]
        cells = [_signed_with_interval(d["tad_minus_msp"], d["tad_minus_msp_ci95"]) for d in differences]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    means = report["mean_tad_minus_msp_informative_by_aggregation"]
    lines.append(
        f"| *mean, accuracy in [{low}, {high}]* | "
        + " | ".join("n/a" if means[a.value] is None else f"{means[a.value]:+.3f}" for a in Aggregation)
        + " |"
    )
    return "\n".join(lines) + "\n"
