"""The trial rule: when a trial (a target centring, a row weighting, an MLP averaged with the ridge) replaces
what was kept so far.

On a significant fold-paired gain in the selection metric that does not cost the other ranking a
significant loss by the same test: the artifact serves one kind of question per deployment and also the
mixed traffic its thresholds are calibrated on (docs/method.md §6).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any, TypeVar

import numpy as np

from training.decision_rule import fold_standard_error
from training.fit.cross_validation import FOLDS_KEY, ConventionResult
from training.groups import Selection

logger = logging.getLogger(__name__)
Alternative = TypeVar("Alternative", bound=StrEnum)  # a target centring or a row weighting


def paired_gain(trial: Sequence[float], base: Sequence[float]) -> dict[str, float | bool]:
    """Fold-by-fold PRR gain of a trial over the base (same folds); significant when its mean
    exceeds twice its standard error, corrected for the folds' shared training data (roughly a one-sided
    95% test over the folds)."""
    differences = np.array(trial, dtype=np.float64) - np.array(base, dtype=np.float64)
    differences = differences[np.isfinite(differences)]
    if len(differences) < 2:
        return {"mean": math.nan, "standard_error": math.nan, "significant": False}
    mean = float(differences.mean())
    error = fold_standard_error(differences)
    return {"mean": mean, "standard_error": error, "significant": bool(mean > 2 * error)}


def trial_verdict(trial_row: dict[str, Any], base_row: dict[str, Any], selection: Selection) -> dict[str, Any]:
    """Whether a trial (centring, weighting, an MLP average) replaces the base, from their CV rows on the
    same folds: on a significant gain in the selection metric, and only if the other metric does not lose
    significantly. The artifact serves both kinds of traffic (one kind of question per deployment, and the
    mixed traffic its thresholds are calibrated on), so a gain in one ranking must not be bought with the other.
    """
    other = Selection.POOLED if selection is Selection.WITHIN_GROUP else Selection.WITHIN_GROUP
    gain = paired_gain(trial_row["prr_folds"], base_row["prr_folds"])
    other_loss = paired_gain(base_row[FOLDS_KEY[other]], trial_row[FOLDS_KEY[other]])
    kept = bool(gain["significant"] and trial_row["prr_mean"] > base_row["prr_mean"] and not other_loss["significant"])
    return {
        "gain": gain,
        "other_metric": other.value,
        "other_change": {"mean": -other_loss["mean"], "standard_error": other_loss["standard_error"]},
        "other_loss_significant": other_loss["significant"],
        "kept": kept,
    }


def keep_by_trial_rule(
    result: ConventionResult,
    current: str,
    alternatives: Sequence[Alternative],
    cross_validate_with: Callable[[Alternative], ConventionResult],
) -> tuple[ConventionResult, dict[str, Any]]:
    """Each alternative cross-validated in turn on the same folds; one replaces the result only when
    `trial_verdict` keeps it. Returns the result kept and every alternative's numbers by name."""
    record: dict[str, Any] = {current: {"prr_mean": result.prr, "chosen": result.chosen_row}}
    for alternative in alternatives:
        logger.info("trying %s: %s", type(alternative).__name__, alternative.value)
        trial = cross_validate_with(alternative)
        verdict = trial_verdict(trial.chosen_row, result.chosen_row, result.selection)
        record[alternative.value] = {"prr_mean": trial.prr, "chosen": trial.chosen_row, **verdict}
        if verdict["kept"]:
            result = trial
    return result, record
