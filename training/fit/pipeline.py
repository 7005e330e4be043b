"""`run_fit`: the whole fit, in order (training/fit/__init__.py says what each step is)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from app.identity import ModelIdentity
from app.uncertainty.artifact import FeatureInfo, Manifest, RegressorInfo
from app.uncertainty.features import Convention, FeatureSpec
from app.uncertainty.methods import Method
from app.uncertainty.tad import Regressor
from training.decision_rule import DecisionRule, choose
from training.fit.artifact import check_out, write_artifact
from training.fit.cross_validation import (
    Choice,
    ConventionResult,
    choose_convention,
    cross_validate_convention,
    fit_final,
)
from training.fit.fold_progress import FoldProgress, progress_root
from training.fit.mlp import choose_stage2
from training.fit.options import FitOptions
from training.fit.report import cv_record, manifest_summary, served_row
from training.fit.texts import load_runs
from training.fit.trial_rule import keep_by_trial_rule
from training.progress import ProgressStore, array_digest, digest
from training.runs import read_run_settings, run_dtype
from training.two_stage import FitText

logger = logging.getLogger(__name__)

# Raised when a change alters what a trial's cross-validation computes (training/fit/cross_validation.py).
TRIAL_STORE_VERSION = 1


def run_fit(options: FitOptions) -> Manifest:
    """Cross-validate, fit the chosen configuration on every text, and write the artifact to `options.out`."""
    started = time.monotonic()
    check_out(options.out, options.runs)
    texts, settings, lags = load_runs(options.runs, options.n_lags)
    if len({t.target for t in texts}) < 2:
        # Every PRR would be undefined and every regressor a constant: nothing to rank answers with.
        raise SystemExit(
            f"all {len(texts)} answers have the same quality ({texts[0].target:g}): fit needs right and wrong "
            "answers (other data, or more records)"
        )
    identity = ModelIdentity.model_validate(settings["identity"])
    progress = trial_progress(options, texts, lags)
    results = cross_validate_conventions(texts, identity, lags, options, progress)
    result, centrings, weightings = settle_trials(texts, results[choose_convention(results)], options, progress)
    chosen = Choice.of(result.chosen_row)
    others = [
        Choice.of(result.best[v.value]) for v in options.variants if v is not chosen.variant and v.value in result.best
    ]
    (stage1, ridge), *alternatives = fit_final(
        result.texts, result.spec, result.data, [chosen, *others], options.epsilon
    )
    stage2, mlp_record = choose_stage2(result, ridge, options)
    record = cv_record(options, result, results, centrings, weightings, mlp_record)
    decision = decision_of(record, stage2.kind)
    record["decision"] = decision.as_dict()
    regressors: dict[str, Regressor] = {"regressor.joblib": stage2.regressor, "stage1.joblib": stage1}
    for choice, (stage1_other, stage2_other) in zip(others, alternatives, strict=True):
        regressors[f"alternatives/{choice.variant.value}/regressor.joblib"] = stage2_other
        regressors[f"alternatives/{choice.variant.value}/stage1.joblib"] = stage1_other
    spec = result.spec
    manifest = Manifest(
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        llm=identity,
        dtype=run_dtype(settings),
        features=FeatureInfo.of(spec),
        epsilon=options.epsilon,
        aggregation=stage2.aggregation,
        variant=chosen.variant.value,
        regressor=RegressorInfo(file="regressor.joblib", kind=stage2.kind, params=stage2.params),
        decision_method=Method(decision.chosen),
        metrics={
            "cv": manifest_summary(record, stage2.kind),
            "alternatives": {
                choice.variant.value: {
                    "file": f"alternatives/{choice.variant.value}/regressor.joblib",
                    "alpha": choice.alpha,
                    "alpha_stage1": choice.alpha_stage1,
                    "aggregation": result.best[choice.variant.value]["aggregation"],
                }
                for choice in others
            },
        },
        training=training_record(options, result.texts, settings, started),
    )
    written = write_artifact(options.out, manifest, regressors, record)
    if options.mlp:
        FoldProgress(options, chosen, result.spec, result.texts, result.data).discard()
    progress.discard()
    return written


def trial_progress(options: FitOptions, texts: Sequence[FitText], lags: int) -> ProgressStore:
    """Where this fit keeps each finished trial's cross-validation (a convention, centring and weighting: most
    of a fit without --mlp) for its rerun: under a key of the options that shape a trial, the lags it reads,
    each run's settings and every text, its numbers (probabilities, statistics, attention rows) included.
    TRIAL_STORE_VERSION changes with what a trial computes, so that no older code's trials are read back."""
    described = {
        "version": TRIAL_STORE_VERSION,
        "options": options.described(without_mlp=True),
        "lags": lags,
        "runs": [read_run_settings(Path(run)) for run in options.runs],
    }
    lines = (
        f"{t.key}\t{t.group}\t{t.target!r}\t{t.row_weight!r}\t{len(t)}\t"
        + "\t".join(array_digest(values) for values in (t.probs, t.attention, *_stats_in_order(t)))
        for t in texts
    )
    return ProgressStore(progress_root(options) / f"trials-{digest(described, lines)}")


def _stats_in_order(text: FitText) -> list[np.ndarray]:
    return [text.stats[name] for name in sorted(text.stats)]


def decision_of(record: dict[str, Any], kind: str) -> DecisionRule:
    """TAD as served against every free score on the same CV folds (training/decision_rule.py)."""
    samples = {"tad": served_row(record, kind)["prr_folds"]}
    samples.update({name: row["prr_folds"] for name, row in record["baselines"].items()})
    rule = choose("tad", samples, "folds")
    if rule.chosen != "tad":
        logger.warning(
            "%s beats TAD in cross-validation by %.3f (%.1f%% interval %s): the artifact decides with %s",
            rule.chosen,
            rule.gain,
            100 * rule.level,
            rule.interval,
            rule.chosen,
        )
    return rule


def cross_validate_conventions(
    texts: Sequence[FitText], identity: ModelIdentity, lags: int, options: FitOptions, progress: ProgressStore
) -> dict[Convention, ConventionResult]:
    """Each attention convention's cross-validation, with the first centring and weighting tried."""
    results = {}
    for convention in options.conventions:
        spec = FeatureSpec(
            n_lags=lags,
            num_layers=identity.num_layers,
            num_heads=identity.num_heads,
            convention=convention,
        )
        logger.info(
            "fitting (%s convention) on %d texts, %d tokens, %d stage-2 features",
            convention.value,
            len(texts),
            sum(len(t) for t in texts),
            spec.stage2_size,
        )
        results[convention] = cross_validate_convention(
            texts, spec, options, centring=options.centrings[0], weighting=options.weightings[0], progress=progress
        )
    return results


def settle_trials(
    texts: Sequence[FitText], result: ConventionResult, options: FitOptions, progress: ProgressStore
) -> tuple[ConventionResult, dict[str, Any], dict[str, Any]]:
    """The target centrings, then the row weightings, tried in turn under the trial rule on the chosen
    convention: the result kept, and the record of each centring and each weighting tried."""
    base = result
    result, centrings = keep_by_trial_rule(
        result,
        result.centring.value,
        options.centrings[1:],
        lambda c: cross_validate_convention(
            texts, base.spec, options, centring=c, weighting=base.weighting, progress=progress
        ),
    )
    settled = result
    result, weightings = keep_by_trial_rule(
        result,
        result.weighting.value,
        options.weightings[1:],
        lambda w: cross_validate_convention(
            texts, settled.spec, options, centring=settled.centring, weighting=w, progress=progress
        ),
    )
    return result, centrings, weightings


def training_record(
    options: FitOptions, texts: Sequence[FitText], settings: dict[str, Any], started: float
) -> dict[str, Any]:
    """The manifest's `training`: what the fit read (its runs, by absolute path), how long it took, and the
    versions that matter for unpickling the regressor and for the features."""
    datasets: dict[str, int] = {}
    for text in texts:
        datasets[text.dataset] = datasets.get(text.dataset, 0) + 1
    return {
        "runs": [str(Path(p).resolve()) for p in options.runs],
        "texts": len(texts),
        "tokens": int(sum(len(t) for t in texts)),
        "datasets": datasets,
        "fit_seconds": round(time.monotonic() - started, 1),
        "versions": library_versions(),
        "generation": {
            k: settings[k] for k in ("model", "data", "limit", "max_new_tokens", "prompts") if k in settings
        },
    }


def library_versions() -> dict[str, str]:
    """Versions that matter for unpickling the regressor and for the features."""
    from importlib.metadata import version

    return {name: version(name) for name in ("scikit-learn", "numpy", "torch", "transformers")}
