"""What `calibrate` does: reject thresholds on calibration data, written into the artifact's manifest
(the threshold rules themselves: training/thresholds.py)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import beta

from app.uncertainty.artifact import Manifest, Threshold, load_artifact, write_manifest
from app.uncertainty.methods import Method
from training.check_pass_scores import CheckPassOptions, check_pass_methods, check_pass_table
from training.method_scores import artifact_methods, uncertainty_table
from training.rejection import CORRECT_THRESHOLD, accuracy
from training.run_source import RunSource, check_held_out, obtain_runs
from training.runs import TextTrace, check_no_duplicates, iter_texts
from training.thresholds import (
    coverage_name,
    coverage_threshold,
    error_name,
    error_threshold,
    error_threshold_natural,
    out_of_sample,
)

logger = logging.getLogger(__name__)

KEEP_HALF = "keep-half"
"""`--default-target keep-half`: the strictest certified error target that accepts at least half of the
correct answers, with the same confidence as the error bound (`default_keeping`)."""


@dataclass(frozen=True)
class Calibration:
    """Every method's thresholds on one calibration set, the default target, and what they do out of sample."""

    thresholds: dict[Method, dict[str, Threshold]]
    default_target: str | None
    record: dict[str, Any]


def kept_share_lower_bound(kept: int, correct: int, delta: float) -> float:
    """One-sided (1 - delta) Clopper-Pearson lower bound on the share of correct answers a threshold accepts."""
    return float(beta.ppf(delta, kept, correct - kept + 1)) if kept > 0 else 0.0


def default_keeping(
    decided: dict[str, Threshold], values: np.ndarray, quality: np.ndarray, keep: float, delta: float
) -> str | None:
    """The strictest certified error target whose threshold accepts at least a share `keep` of the correct
    answers, by a lower confidence bound (1 - delta) and not just on these answers: a default that withholds most
    right answers is not one a user keeps switched on, and the promise has to hold on answers it was not chosen on.
    Where none keeps that many, the loosest certified target; None where no error target was certified."""
    correct = quality >= CORRECT_THRESHOLD
    errors = sorted((entry.target, name) for name, entry in decided.items() if entry.kind == "error")
    for _, name in errors:
        kept = int((values[correct] <= decided[name].threshold).sum())
        if correct.any() and kept_share_lower_bound(kept, int(correct.sum()), delta) >= keep:
            return name
    return errors[-1][1] if errors else None


@dataclass(frozen=True)
class CalibrationTargets:
    """What to certify: coverage targets, error targets at confidence 1 - `delta`, how thresholds are searched
    (`order`), and the default target (a target's name, "keep-half", or None: the first feasible one)."""

    coverages: Sequence[float]
    errors: Sequence[float]
    delta: float
    seed: int = 0
    default_target: str | None = None
    order: str = "natural"


def calibrate_thresholds(
    table: dict[str, np.ndarray],
    quality: np.ndarray,
    methods: Sequence[Method],
    decision: Method,
    targets: CalibrationTargets,
) -> Calibration:
    """Thresholds of every method for each target on these answers (`table`: each method's scores), the
    default target for the `decision` method (`default_target` "keep-half": `default_keeping` at 0.5), and
    the thresholds' out-of-sample behaviour on random halves."""
    coverages, errors, delta, seed = targets.coverages, targets.errors, targets.delta, targets.seed
    order, default_target = targets.order, targets.default_target

    def choose(values: np.ndarray, labels: np.ndarray, chosen_order: str) -> dict[str, Threshold]:
        entries = {coverage_name(c): coverage_threshold(values, labels, c) for c in coverages}
        for error in errors:
            if chosen_order == "natural":
                chosen = error_threshold_natural(values, labels, error, delta=delta)
            else:
                chosen = error_threshold(values, labels, error, delta=delta, seed=seed)
            if chosen is not None:
                entries[error_name(error)] = chosen
        return entries

    thresholds: dict[Method, dict[str, Threshold]] = {}
    for method in methods:
        thresholds[method] = choose(table[method.value], quality, order)
        for error in errors:
            if error_name(error) not in thresholds[method]:
                logger.warning("%s: no threshold certifies error <= %g at delta %g", method.value, error, delta)
    # What the thresholds do on data they were not chosen on: choose on one half, measure on the other.
    halves = np.array_split(np.random.default_rng(seed).permutation(len(quality)), 2)
    held_out: dict[str, dict[str, Any]] = {}
    for method in methods:
        values = table[method.value]
        chosen_a = choose(values[halves[0]], quality[halves[0]], order)
        held_out[method.value] = {
            name: {"threshold": entry.threshold, **out_of_sample(entry, values[halves[1]], quality[halves[1]])}
            for name, entry in chosen_a.items()
        }
    # The natural order against the split order, on the same data and delta (the decision method).
    other_order = "split" if order == "natural" else "natural"
    split_order = choose(table[decision.value], quality, other_order)
    orders = {
        name: {order: entry.coverage, other_order: split_order[name].coverage if name in split_order else None}
        for name, entry in thresholds[decision].items()
        if entry.kind == "error"
    }
    decided = thresholds[decision]
    if default_target == KEEP_HALF:
        default_target = default_keeping(decided, table[decision.value], quality, 0.5, delta)
    elif default_target is not None and default_target not in decided:
        raise SystemExit(
            f"--default-target {default_target} was not calibrated for {decision.value} (have: {', '.join(decided)})"
        )
    feasible_errors = [error_name(e) for e in errors if error_name(e) in decided]
    default = default_target or (feasible_errors[0] if feasible_errors else None)
    if default is None and coverages:
        default = coverage_name(coverages[0])
    matched = round(decided[default].coverage, 2) if default is not None else 0.0
    if matched > 0:  # a default that keeps nothing is refused by `check_default`, not compared
        # Every method at the coverage the default policy achieves: comparisons at equal coverage.
        for method in methods:
            thresholds[method].setdefault(
                coverage_name(matched), coverage_threshold(table[method.value], quality, matched)
            )
    record = {
        "n": len(quality),
        "delta": delta,
        "order": order,
        "decision_method": decision.value,
        "accuracy": float(accuracy(quality)),
        "out_of_sample": {"split": "random halves", "seed": seed, "by_method": held_out},
        "coverage_by_order": orders,
    }
    return Calibration(thresholds, default, record)


def check_default(calibration: Calibration, decision: Method, errors: Sequence[float]) -> None:
    """Refuse, before anything is written, a default policy the service could not use: none at all, or one that
    accepts no calibration answer (too few answers for its coverage); say so when no requested error target was
    certified and the default is a coverage target, which bounds no error rate."""
    n = calibration.record["n"]
    default = calibration.default_target
    if default is None:
        raise SystemExit(
            f"no target is calibrated for {decision.value} on these {n} answers: no --error target is certified "
            "and no --coverage target was given; nothing written"
        )
    chosen = calibration.thresholds[decision][default]
    if chosen.coverage <= 0:
        raise SystemExit(
            f"the default target {default} accepts none of the {n} calibration answers (every answer would be "
            "rejected): calibrate on more answers; nothing written"
        )
    certified = any(entry.kind == "error" for entry in calibration.thresholds[decision].values())
    if chosen.kind == "coverage" and errors and not certified:
        logger.warning(
            "no --error target is certified for %s: the default target is %s, which bounds no error rate (%.3f of "
            "the calibration answers it accepts are wrong)",
            decision.value,
            default,
            chosen.error,
        )


def warn_on_twins(texts: Sequence[TextTrace]) -> None:
    """The binomial tests count answers as independent; one record asked in both prompt styles gives two
    answers that are not (docs/experiments/folds-by-record.md), which makes the guarantee optimistic."""
    styles: dict[str, set[str]] = {}
    for text in texts:
        styles.setdefault(text.key, set()).add(text.prompt_style.value)
    twins = sum(len(found) > 1 for found in styles.values())
    if twins:
        logger.warning(
            "%d of the %d records are answered in more than one prompt style: the guarantee counts each answer as "
            "independent, which such twins are not, so it is optimistic; calibrate on one style",
            twins,
            len(styles),
        )


def run_calibrate(artifact_dir: Path, source: RunSource, targets: CalibrationTargets) -> Manifest:
    if not targets.coverages and not targets.errors:
        # Nothing to choose: writing would replace every calibrated threshold with none.
        raise SystemExit("give at least one --coverage or --error target")
    artifact = load_artifact(artifact_dir)
    runs = obtain_runs(source, artifact)
    texts = list(iter_texts(runs))
    if not texts:
        # Thresholds chosen on nothing are -inf with n 0: refuse before the manifest's calibration is replaced.
        raise SystemExit(f"the runs hold no answers ({', '.join(map(str, runs))}): nothing to calibrate on")
    check_no_duplicates(t.answer_key for t in texts)  # the guarantee counts answers: each must count once
    check_held_out(artifact, (t.key for t in texts), "calibrate on")
    warn_on_twins(texts)
    checked = check_pass_methods(artifact)  # asked of the model again only for answers not asked about yet
    table = {
        **uncertainty_table(artifact, texts),
        **check_pass_table(checked, runs, texts, CheckPassOptions(source.device, source.cache_dir)),
    }
    quality = np.array([t.target for t in texts])
    methods = [Method(name) for name in [*artifact_methods(artifact), *checked]]
    # The default target is certified for what the service decides with.
    calibration = calibrate_thresholds(table, quality, methods, artifact.decision_method, targets)
    check_default(calibration, artifact.decision_method, targets.errors)
    manifest = artifact.manifest.model_copy(
        update={
            "thresholds": calibration.thresholds,
            "default_target": calibration.default_target,
            "metrics": {
                **artifact.manifest.metrics,
                # Resolved: `evaluate` recognises its calibration runs from any working directory.
                "calibration": {"runs": [str(Path(run).resolve()) for run in runs], **calibration.record},
            },
        }
    )
    return write_manifest(artifact.path, manifest)
