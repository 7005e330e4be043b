"""Cross-validation of the ridge candidates: folds, held-out PRR, the choice per variant and convention.

Every (variant, stage-1 alpha, stage-2 alpha) candidate is fitted on the training folds from Gram
statistics (training/ridge.py) and scored on the held-out fold by the server's own recurrent scorer,
under every aggregation and both selection metrics; the final fits use all folds.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from app.uncertainty.aggregation import Aggregation, aggregate
from app.uncertainty.features import Convention, FeatureSpec
from app.uncertainty.methods import BASELINES
from app.uncertainty.tad import Regressor, TadScorer
from training.fit.options import FitOptions
from training.folds import assign_folds
from training.groups import Selection, TargetCentring, centred, informative_groups, within_group_prr
from training.method_scores import baseline_table, ranked
from training.progress import ProgressStore
from training.rejection import prediction_rejection_ratio
from training.ridge import GramStats, fit_ridge
from training.two_stage import (
    FitText,
    Variant,
    cross_stats,
    stage1_confidences,
    stage1_stats,
    stage2_stats,
    static_stats,
    teacher_forced_stats,
)
from training.weighting import RowWeighting, weighted

logger = logging.getLogger(__name__)

SELECTION_WORDS = {
    Selection.POOLED: "pooled",
    Selection.WITHIN_GROUP: "mean within each informative dataset/prompt-style group",
}
FOLDS_KEY = {Selection.POOLED: "pooled_prr_folds", Selection.WITHIN_GROUP: "within_group_prr_folds"}
"""Where a CV row keeps each metric's per-fold PRR (the trial rule compares them fold by fold)."""


@dataclass
class Candidate:
    variant: Variant
    alpha_stage1: float
    alpha: float  # stage 2
    # Held-out PRR per fold, by selection metric and aggregation.
    prr: dict[Selection, dict[Aggregation, list[float]]] = field(
        default_factory=lambda: {s: {a: [] for a in Aggregation} for s in Selection}
    )


@dataclass
class FoldData:
    """Per-fold statistics, accumulated once and reused by every candidate."""

    fold_of: np.ndarray
    groups: list[list[FitText]]
    stage1: list[GramStats]
    static: list[GramStats]
    teacher_forced: list[GramStats]  # the authors' stage 1 (full vectors, earlier c = target)
    informative: frozenset[str] = frozenset()  # groups the within-group metric averages over

    @property
    def count(self) -> int:
        return len(self.groups)

    def static_without(self, excluded: int | None) -> GramStats:
        kept = [s for g, s in enumerate(self.static) if g != excluded]
        return sum(kept[1:], kept[0])

    def texts_without(self, excluded: int | None, texts: Sequence[FitText]) -> tuple[list[FitText], np.ndarray]:
        mask = self.fold_of != excluded
        return [t for t, keep in zip(texts, mask, strict=True) if keep], self.fold_of[mask]


def prepare_folds(texts: Sequence[FitText], spec: FeatureSpec, options: FitOptions) -> FoldData:
    fold_of = assign_folds(texts, options.folds, options.seed, options.fold_unit)
    groups = [[t for t, f in zip(texts, fold_of, strict=True) if f == g] for g in range(options.folds)]
    stage1 = [stage1_stats(group, spec) for group in groups]
    static = [static_stats(group, spec) for group in tqdm(groups, desc="fit: static Gram per fold", unit="fold")]
    forced = (
        [teacher_forced_stats(group, stats, spec) for group, stats in zip(groups, static, strict=True)]
        if Variant.AUTHORS in options.variants
        else []
    )
    return FoldData(
        fold_of=fold_of,
        groups=groups,
        stage1=stage1,
        static=static,
        teacher_forced=forced,
        informative=informative_groups(texts),
    )


def stage1_for_stage2(
    texts: Sequence[FitText],
    text_folds: np.ndarray,
    data: FoldData,
    available: Sequence[int],
    alpha: float,
    variant: Variant,
    spec: FeatureSpec,
    epsilon: float,
) -> list[np.ndarray]:
    """Stage-1 confidences of texts drawn from folds `available`, as stage 2 trains on them.

    algorithm1-literal: one model on all of them, predicting in-sample; leak-free: each text
    predicted by a model trained without its own fold; authors: the same out-of-fold models,
    fitted on teacher-forced full vectors and applied recurrently (the server's scorer).
    """
    if variant is Variant.AUTHORS:
        by_fold = data.teacher_forced
        total = sum((by_fold[g] for g in available[1:]), by_fold[available[0]])
        scorers = {g: TadScorer(fit_ridge(total - by_fold[g], alpha), spec, epsilon) for g in available}
        return [
            scorers[int(g)].confidences_of(t.token_trace()) if len(t) else np.zeros(0)
            for t, g in zip(texts, text_folds, strict=True)
        ]
    s1_by_fold = data.stage1
    total = sum((s1_by_fold[g] for g in available[1:]), s1_by_fold[available[0]])
    if variant is Variant.ALGORITHM1_LITERAL:
        model = fit_ridge(total, alpha)
        return [stage1_confidences(t, model, variant, spec, epsilon) for t in texts]
    models = {g: fit_ridge(total - s1_by_fold[g], alpha) for g in available}
    return [
        stage1_confidences(t, models[int(g)], variant, spec, epsilon) for t, g in zip(texts, text_folds, strict=True)
    ]


def held_out_prr(
    scorer: TadScorer, texts: Sequence[FitText], groups: frozenset[str]
) -> dict[Selection, dict[Aggregation, float]]:
    """Both selection metrics of the scorer on held-out texts, for each aggregation."""
    confidences = [scorer.confidences_of(t.token_trace()) if len(t) else np.zeros(0) for t in texts]
    scores = {a: np.array([ranked(aggregate(c, a)) for c in confidences]) for a in Aggregation}
    targets = np.array([t.target for t in texts])
    return {
        Selection.POOLED: {a: prediction_rejection_ratio(v, targets) for a, v in scores.items()},
        Selection.WITHIN_GROUP: {a: within_group_prr(v, texts, groups) for a, v in scores.items()},
    }


def cross_validate(
    texts: Sequence[FitText], spec: FeatureSpec, data: FoldData, options: FitOptions
) -> tuple[list[Candidate], dict[Selection, dict[str, list[float]]]]:
    """Every (variant, stage-1 alpha, stage-2 alpha) candidate on every held-out fold, for every aggregation."""
    stage1_keys = [(v, a1) for v in options.variants for a1 in options.stage1_alphas or options.alphas]
    candidates = [Candidate(v, a1, a2) for v, a1 in stage1_keys for a2 in options.alphas]
    baselines: dict[Selection, dict[str, list[float]]] = {s: {m.value: [] for m in BASELINES} for s in Selection}
    for f in tqdm(range(data.count), desc="fit: cross-validation", unit="fold"):
        train, train_folds = data.texts_without(f, texts)
        available = [g for g in range(data.count) if g != f]
        confidences = [
            stage1_for_stage2(train, train_folds, data, available, a1, v, spec, options.epsilon)
            for v, a1 in stage1_keys
        ]
        cross = cross_stats(train, confidences, spec)
        static_train = data.static_without(f)
        for candidate in candidates:
            k = stage1_keys.index((candidate.variant, candidate.alpha_stage1))
            model = fit_ridge(stage2_stats(static_train, cross, k, spec), candidate.alpha)
            scored = held_out_prr(TadScorer(model, spec, options.epsilon), data.groups[f], data.informative)
            for selection, by_aggregation in scored.items():
                for aggregation, value in by_aggregation.items():
                    candidate.prr[selection][aggregation].append(value)
        held = data.groups[f]
        targets = np.array([t.target for t in held])
        for name, values in baseline_table([t.token_trace() for t in held]).items():
            baselines[Selection.POOLED][name].append(prediction_rejection_ratio(values, targets))
            baselines[Selection.WITHIN_GROUP][name].append(within_group_prr(values, held, data.informative))
    return candidates, baselines


def effective_selection(selection: Selection, data: FoldData) -> Selection:
    """Within-group selection needs an informative group; without one it is pooled (and said so)."""
    if selection is Selection.POOLED or data.informative:
        return selection
    logger.warning(
        "no dataset group is informative (each almost all right or all wrong): configurations are selected by "
        "pooled PRR instead of within-group PRR"
    )
    return Selection.POOLED


def mean_finite(values: Sequence[float]) -> float:
    """The mean of the values that are not NaN (a fold's PRR is undefined where all its answers are alike)."""
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def prr_order(row: dict[str, Any]) -> float:
    """Sort key of a CV row: its mean PRR, an undefined one lowest."""
    return -math.inf if math.isnan(row["prr_mean"]) else float(row["prr_mean"])


def cv_table(candidates: Sequence[Candidate], selection: Selection) -> list[dict[str, Any]]:
    """One row per candidate and aggregation; `prr_*` hold the selection metric, the other is beside it."""
    rows = []
    for c in candidates:
        for aggregation in Aggregation:
            values = c.prr[selection][aggregation]
            rows.append(
                {
                    "variant": c.variant.value,
                    "alpha": c.alpha,
                    "alpha_stage1": c.alpha_stage1,
                    "aggregation": aggregation.value,
                    "prr_mean": mean_finite(values),
                    "prr_std": float(np.nanstd(values)) if values else math.nan,
                    "prr_folds": values,
                    "pooled_prr_mean": mean_finite(c.prr[Selection.POOLED][aggregation]),
                    "within_group_prr_mean": mean_finite(c.prr[Selection.WITHIN_GROUP][aggregation]),
                    **{FOLDS_KEY[s]: c.prr[s][aggregation] for s in Selection},
                }
            )
    return rows


def best_per_variant(table: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for row in table:
        current = best.get(row["variant"])
        if current is None or prr_order(row) > prr_order(current):
            best[row["variant"]] = row
    return best


@dataclass
class ConventionResult:
    """Cross-validation of every candidate under one attention convention (and target centring and row
    weighting). `folds` prepares its folds' statistics: a result read back from a stopped fit's progress
    has none until the final fit asks for them (`data`); the trials it lost to never do."""

    spec: FeatureSpec
    folds: Callable[[], FoldData]
    table: list[dict[str, Any]]
    best: dict[str, dict[str, Any]]
    chosen_row: dict[str, Any]
    baselines: dict[Selection, dict[str, list[float]]]
    selection: Selection
    centring: TargetCentring = TargetCentring.NONE
    weighting: RowWeighting = RowWeighting.TOKEN
    texts: Sequence[FitText] = ()
    prepared: FoldData | None = field(default=None, repr=False)

    @property
    def data(self) -> FoldData:
        if self.prepared is None:
            self.prepared = self.folds()
        return self.prepared

    @property
    def prr(self) -> float:
        return prr_order(self.chosen_row)

    def summary(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen_row,
            "best_per_variant": self.best,
            "target_centring": self.centring.value,
            "row_weighting": self.weighting.value,
        }


def cross_validate_convention(
    texts: Sequence[FitText],
    spec: FeatureSpec,
    options: FitOptions,
    centring: TargetCentring = TargetCentring.NONE,
    weighting: RowWeighting = RowWeighting.TOKEN,
    progress: ProgressStore | None = None,
) -> ConventionResult:
    """Cross-validation under one feature spec, target centring and row weighting. With `progress`, a finished
    trial is kept there and read back by the same fit rerun (the cross-validation is most of a fit)."""
    texts = weighted(centred(texts, centring), weighting)
    name = f"cv-{spec.convention.value}-{centring.value}-{weighting.value}"
    restored = _restored(progress.load(name) if progress is not None else None)
    prepared = None
    if restored is not None:
        table, baselines, selection = restored
    else:
        prepared = prepare_folds(texts, spec, options)
        candidates, baselines = cross_validate(texts, spec, prepared, options)
        selection = effective_selection(options.selection, prepared)
        table = cv_table(candidates, selection)
        if progress is not None:
            progress.save(name, {"table": table, "baselines": _baselines_json(baselines), "selection": selection.value})
    best = best_per_variant(table)
    chosen = sorted(best.values(), key=prr_order)[-1]
    undefined = sum(value is None or math.isnan(value) for value in chosen["prr_folds"])
    if undefined:
        logger.warning(
            "%d of the %d folds have no defined PRR (all their answers alike): the CV PRR %.3f is the mean of the "
            "others",
            undefined,
            len(chosen["prr_folds"]),
            chosen["prr_mean"],
        )
    return ConventionResult(
        spec=spec,
        folds=lambda: prepare_folds(texts, spec, options),
        table=table,
        best=best,
        chosen_row=chosen,
        baselines=baselines,
        selection=selection,
        centring=centring,
        weighting=weighting,
        texts=texts,
        prepared=prepared,
    )


def _restored(
    saved: Any,
) -> tuple[list[dict[str, Any]], dict[Selection, dict[str, list[float]]], Selection] | None:
    """A trial's CV table, baselines and selection as a stopped fit saved them (None: none, or another version's)."""
    try:
        return saved["table"], _baselines_of(saved["baselines"]), Selection(saved["selection"])
    except (TypeError, KeyError, ValueError, AttributeError):
        return None


def _baselines_json(baselines: dict[Selection, dict[str, list[float]]]) -> dict[str, dict[str, list[float]]]:
    return {selection.value: by_method for selection, by_method in baselines.items()}


def _baselines_of(saved: dict[str, dict[str, list[float]]]) -> dict[Selection, dict[str, list[float]]]:
    return {Selection(selection): {name: [float(v) for v in values] for name, values in by_method.items()}
            for selection, by_method in saved.items()}  # fmt: skip


def choose_convention(results: dict[Convention, ConventionResult]) -> Convention:
    """The authors' (generating) convention, unless the consuming one beats it by more than its CV std."""
    if len(results) == 1:
        return next(iter(results))
    generating, consuming = results[Convention.GENERATING], results[Convention.CONSUMING]
    margin = float(consuming.chosen_row["prr_std"])
    return Convention.CONSUMING if consuming.prr > generating.prr + margin else Convention.GENERATING


@dataclass(frozen=True)
class Choice:
    """One fitted configuration: variant and each stage's alpha."""

    variant: Variant
    alpha_stage1: float
    alpha: float

    @classmethod
    def of(cls, row: dict[str, Any]) -> Choice:
        return cls(Variant(row["variant"]), float(row["alpha_stage1"]), float(row["alpha"]))


def _required(stats: GramStats | None, variant: Variant) -> GramStats:
    if stats is None:
        raise ValueError(f"the {variant.value} variant needs statistics these folds were not prepared with")
    return stats


def fit_final(
    texts: Sequence[FitText], spec: FeatureSpec, data: FoldData, chosen: Sequence[Choice], epsilon: float
) -> list[tuple[Regressor, Regressor]]:
    """(stage-1, stage-2) models on all texts for each choice."""
    available = list(range(data.count))
    confidences = [
        stage1_for_stage2(texts, data.fold_of, data, available, c.alpha_stage1, c.variant, spec, epsilon)
        for c in chosen
    ]
    cross = cross_stats(texts, confidences, spec)
    static_total = data.static_without(None)
    stage1_totals = {
        # Only the authors' variant needs teacher-forced stage-1 statistics (prepare_folds makes them for it).
        Variant.AUTHORS: sum(data.teacher_forced[1:], data.teacher_forced[0]) if data.teacher_forced else None,
        Variant.LEAK_FREE: sum(data.stage1[1:], data.stage1[0]),
        Variant.ALGORITHM1_LITERAL: sum(data.stage1[1:], data.stage1[0]),
    }
    return [
        (
            fit_ridge(_required(stage1_totals[c.variant], c.variant), c.alpha_stage1),
            fit_ridge(stage2_stats(static_total, cross, k, spec), c.alpha),
        )
        for k, c in enumerate(chosen)
    ]
