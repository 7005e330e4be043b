"""`fit`: cross-validated two-stage training of TAD and the artifact the server loads.

5-fold cross-validation split by record (a question's answers in both prompt styles share a
fold; training/folds.py); grid: attention convention x variant (leak-free,
algorithm1-literal, authors; training/two_stage.py) x stage-1 ridge alpha x stage-2 ridge
alpha x aggregation, then target centring within groups (training/groups.py), then row
weighting (training/weighting.py), selected by PRR at 50% rejection of the held-out folds (by
default the mean within each informative dataset/prompt-style group; pooled on request),
scored with the very scorer the server runs (recurrent, c_1 = p_1). Stage-1 predictions that
stage 2 trains on come from inner folds of each outer training set (nested by the same unit). The
best variant becomes the artifact's regressor; the others are kept beside it for
comparison, and every number goes into the manifest. Memory: Gram matrices only (about
(2 x folds + 6) x F^2 x 8 bytes at peak), never a fold's feature matrix; attention rows
are memory-mapped from the run shards.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

import joblib
import numpy as np
from tqdm import tqdm

from app.identity import ModelIdentity
from app.uncertainty.aggregation import Aggregation, aggregate
from app.uncertainty.artifact import MANIFEST_NAME, FeatureInfo, Manifest, RegressorInfo, write_manifest
from app.uncertainty.features import Convention, FeatureSpec
from app.uncertainty.methods import BASELINES
from app.uncertainty.tad import AveragedRegressor, Regressor, TadScorer
from training.combiner import combiner_inputs, cross_validate_combiner, informative_mean, per_dataset_prr
from training.commands.blend import measure_out_of_fold
from training.folds import FoldUnit, assign_folds
from training.groups import (
    Selection,
    TargetCentring,
    centred,
    informative_groups,
    selection_metric,
    within_group_prr,
)
from training.rejection import prediction_rejection_ratio
from training.ridge import GramStats, fit_ridge
from training.runs import RUN_FILE, check_no_duplicates, check_run_folders, iter_texts, read_run_settings
from training.scoring import baseline_table, ranked
from training.two_stage import (
    FitText,
    Variant,
    cross_stats,
    stage1_confidences,
    stage1_stats,
    stage2_matrix,
    stage2_stats,
    static_stats,
    teacher_forced_stats,
)
from training.weighting import RowWeighting, weighted

logger = logging.getLogger(__name__)
Alternative = TypeVar("Alternative", bound=StrEnum)  # a target centring or a row weighting

ALPHAS = (10.0, 1.0, 0.1, 0.01, 0.001, 0.0001)
MLP_CONFIG_KEYS = ("layers", "epochs", "learning_rate", "batch_size")
MLP_GRIDS: dict[str, dict[str, Sequence[float]]] = {
    # The paper's grid (36 configurations).
    "paper": {"layers": (2, 4), "epochs": (10, 20, 30), "learning_rate": (1e-5, 3e-5, 5e-5), "batch_size": (64, 128)},
    # One configuration from it, for a quick check.
    "small": {"layers": (2,), "epochs": (10,), "learning_rate": (5e-5,), "batch_size": (64,)},
}


@dataclass(frozen=True)
class FitOptions:
    runs: Sequence[Path]
    out: Path
    n_lags: int | None = None
    alphas: Sequence[float] = ALPHAS
    folds: int = 5
    fold_unit: FoldUnit = FoldUnit.RECORD  # training/folds.py
    seed: int = 0
    epsilon: float = 1e-4
    mlp: bool = False
    mlp_width: int = 256
    mlp_grid: dict[str, Sequence[float]] = field(default_factory=lambda: dict(MLP_GRIDS["paper"]))
    # Also cross-validate each MLP averaged with the chosen ridge stage 2 (`AveragedRegressor`) on the same
    # folds; the average replaces the single model under the trial rule (beyond the paper: an ablation).
    mlp_average: bool = False
    # Install the average even when the trial rule does not keep it (the verdict is still recorded): how the
    # default artifact's was adopted, on the dev split (README, "Ridge and MLP averaged").
    mlp_average_force: bool = False
    conventions: Sequence[Convention] = (Convention.GENERATING, Convention.CONSUMING)
    variants: Sequence[Variant] = tuple(Variant)
    stage1_alphas: Sequence[float] | None = None  # None: the same grid as stage 2
    combiner: bool = True  # measure the sequence-level combiner (training/combiner.py) and blend's grid out of fold
    selection: Selection = Selection.WITHIN_GROUP
    # Tried in this order; each replaces the one kept so far only when the trial rule keeps it.
    centrings: Sequence[TargetCentring] = tuple(TargetCentring)
    # Likewise, tried after the centring is settled (training/weighting.py).
    weightings: Sequence[RowWeighting] = (RowWeighting.TOKEN, RowWeighting.TEXT)


@dataclass
class Candidate:
    variant: Variant
    alpha_stage1: float
    alpha: float  # stage 2
    # Held-out PRR per fold, by selection metric and aggregation.
    prr: dict[Selection, dict[Aggregation, list[float]]] = field(
        default_factory=lambda: {s: {a: [] for a in Aggregation} for s in Selection}
    )


def load_runs(runs: Sequence[Path], n_lags: int | None) -> tuple[list[FitText], dict[str, Any], int]:
    check_run_folders(runs)
    settings = [read_run_settings(Path(run)) for run in runs]
    first = settings[0]
    for other, run in zip(settings[1:], runs[1:], strict=True):
        if other["model_sha256"] != first["model_sha256"]:
            raise SystemExit(f"run {run} was generated with a different model than {runs[0]}")
    available = min(s["n_lags"] for s in settings)
    lags = n_lags or available
    if lags > available:
        raise SystemExit(f"--n-lags {lags} exceeds the {available} lags stored in the runs")
    texts, keys = [], []
    for trace in iter_texts(runs):
        texts.append(FitText.from_trace(trace, lags))
        keys.append(trace.answer_key)
    if not texts:
        raise SystemExit("the runs hold no completed shards")
    check_no_duplicates(keys)
    return texts, first, lags


def check_out(out: Path, runs: Sequence[Path]) -> None:
    """Refuse an --out the artifact cannot replace, before the minutes of cross-validation rather than after."""
    if out.exists() and not out.is_dir():
        raise SystemExit(f"--out {out} is a file: give a folder for the artifact")
    if (out / RUN_FILE).is_file():
        raise SystemExit(f"--out {out} is a generation run: give another folder for the artifact")
    # The artifact folder is replaced as a whole at the end: a folder holding the runs must not be it.
    resolved = out.resolve()
    for run in runs:
        if resolved == Path(run).resolve() or resolved in Path(run).resolve().parents:
            raise SystemExit(f"--out {out} holds the run {run}: give another folder for the artifact")


def install_artifact(staging: Path, out: Path) -> None:
    """Move the finished artifact `staging` (a sibling of `out`) to `out`, replacing an artifact already there
    (a refit in place, as scripts/train_default.sh does). Renames only: at every moment `out` is the old
    artifact, the new one, or (between two renames) absent, never a mix. What lies beside the old artifact's
    own files (reports, calibration runs) is carried over to the new one."""
    # A fit killed between the renames left the old artifact aside: finish what it was doing first.
    for leftover in sorted(out.parent.glob(f".{out.name}.replaced-*")):
        if out.exists():
            _carry_over(leftover, out)
        else:
            logger.warning("restoring %s, left aside by an interrupted fit", out)
            os.replace(leftover, out)
    if not out.exists():
        os.replace(staging, out)
        return
    old = out.with_name(f".{out.name}.replaced-{os.getpid()}")
    os.replace(out, old)
    os.replace(staging, out)
    _carry_over(old, out)


def _carry_over(old: Path, out: Path) -> None:
    """Move what lay beside the old artifact's own files into `out`, then remove the old artifact."""
    for item in old.iterdir():
        # The old regressors, alternatives and manifest go: an earlier fit's alternatives would otherwise
        # stay beside the new ones and be hashed into the manifest as if they belonged to it.
        own = item.name in (MANIFEST_NAME, "alternatives") or item.suffix == ".joblib"
        if not own and not (out / item.name).exists():
            os.replace(item, out / item.name)
    shutil.rmtree(old)


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


SELECTION_WORDS = {
    Selection.POOLED: "pooled",
    Selection.WITHIN_GROUP: "mean within each informative dataset/prompt-style group",
}


def effective_selection(selection: Selection, data: FoldData) -> Selection:
    """Within-group selection needs an informative group; without one it is pooled."""
    return selection if selection is Selection.POOLED or data.informative else Selection.POOLED


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


FOLDS_KEY = {Selection.POOLED: "pooled_prr_folds", Selection.WITHIN_GROUP: "within_group_prr_folds"}
"""Where a CV row keeps each metric's per-fold PRR (the trial rule compares them fold by fold)."""


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
                    "prr_mean": _mean(values),
                    "prr_std": float(np.nanstd(values)) if values else math.nan,
                    "prr_folds": values,
                    "pooled_prr_mean": _mean(c.prr[Selection.POOLED][aggregation]),
                    "within_group_prr_mean": _mean(c.prr[Selection.WITHIN_GROUP][aggregation]),
                    **{FOLDS_KEY[s]: c.prr[s][aggregation] for s in Selection},
                }
            )
    return rows


def best_per_variant(table: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    best: dict[str, dict[str, Any]] = {}
    for row in table:
        current = best.get(row["variant"])
        score = -math.inf if math.isnan(row["prr_mean"]) else row["prr_mean"]
        if current is None or score > (-math.inf if math.isnan(current["prr_mean"]) else current["prr_mean"]):
            best[row["variant"]] = row
    return best


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


def mlp_search(
    texts: Sequence[FitText], spec: FeatureSpec, data: FoldData, choice: Choice, options: FitOptions
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, list[dict[str, Any]]]:
    """Optional stage-2 MLP (stage 1 stays ridge): the paper's grid, same folds and selection.

    Returns the best MLP row, the best row of an MLP averaged with the chosen ridge stage 2 (None unless
    `options.mlp_average`) and every row. Unlike the ridge path this holds one fold's training matrix in memory.
    """
    from itertools import product

    grid = options.mlp_grid
    configs = [
        dict(zip(MLP_CONFIG_KEYS, values, strict=True)) for values in product(*(grid[key] for key in MLP_CONFIG_KEYS))
    ]
    kinds = ("mlp", "mlp+ridge") if options.mlp_average else ("mlp",)
    # Held-out PRR per fold by (stage-2 kind, configuration index), selection metric and aggregation.
    scores: dict[tuple[str, int], dict[Selection, dict[Aggregation, list[float]]]] = {
        (kind, c): {s: {a: [] for a in Aggregation} for s in Selection} for kind in kinds for c in range(len(configs))
    }
    selection = effective_selection(options.selection, data)
    variant, alpha = choice.variant, choice.alpha_stage1
    for f in tqdm(range(data.count), desc="fit: MLP cross-validation", unit="fold"):
        train, train_folds = data.texts_without(f, texts)
        available = [g for g in range(data.count) if g != f]
        confidences = stage1_for_stage2(train, train_folds, data, available, alpha, variant, spec, options.epsilon)
        ridge = None
        if options.mlp_average:
            stats = stage2_stats(data.static_without(f), cross_stats(train, [confidences], spec), 0, spec)
            ridge = fit_ridge(stats, choice.alpha)
        features, targets, weights = stage2_matrix(train, confidences, spec)
        for c, config in enumerate(configs):
            network = _fit_mlp(config, options, features, targets, weights)
            stage2: dict[str, Regressor] = {"mlp": network}
            if ridge is not None:
                stage2["mlp+ridge"] = AveragedRegressor((ridge, network))
            for kind, regressor in stage2.items():
                scored = held_out_prr(TadScorer(regressor, spec, options.epsilon), data.groups[f], data.informative)
                for metric, by_aggregation in scored.items():
                    for aggregation, value in by_aggregation.items():
                        scores[kind, c][metric][aggregation].append(value)
        del features, targets, weights
    table: list[dict[str, Any]] = [
        {
            "stage2": kind,
            **config,
            "aggregation": aggregation.value,
            "prr_mean": _mean(scores[kind, c][selection][aggregation]),
            "prr_folds": scores[kind, c][selection][aggregation],
            **{FOLDS_KEY[metric]: scores[kind, c][metric][aggregation] for metric in Selection},
        }
        for kind in kinds
        for c, config in enumerate(configs)
        for aggregation in Aggregation
    ]

    def best_of(kind: str) -> dict[str, Any] | None:
        rows = [row for row in table if row["stage2"] == kind]
        return max(rows, key=lambda row: -math.inf if math.isnan(row["prr_mean"]) else row["prr_mean"], default=None)

    return best_of("mlp"), best_of("mlp+ridge"), table


def _fit_mlp(
    config: dict[str, Any], options: FitOptions, features: np.ndarray, targets: np.ndarray, weights: np.ndarray | None
) -> Any:
    """An MLP of one configuration fitted on these rows (random state `options.seed`)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    model = MLPRegressor(
        hidden_layer_sizes=(options.mlp_width,) * int(config["layers"]),
        learning_rate_init=float(config["learning_rate"]),
        max_iter=int(config["epochs"]),
        batch_size=int(config["batch_size"]),
        random_state=options.seed,
    )
    with warnings.catch_warnings():  # the paper's epoch counts stop before scikit-learn's tolerance
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(features, targets, sample_weight=weights)
    return model


def fit_final_mlp(
    texts: Sequence[FitText],
    spec: FeatureSpec,
    data: FoldData,
    variant: Variant,
    alpha: float,
    config: dict[str, Any],
    options: FitOptions,
) -> Regressor:

    available = list(range(data.count))
    confidences = stage1_for_stage2(texts, data.fold_of, data, available, alpha, variant, spec, options.epsilon)
    features, targets, weights = stage2_matrix(texts, confidences, spec)
    return _fit_mlp(config, options, features, targets, weights)


def out_of_fold_confidences(
    texts: Sequence[FitText], spec: FeatureSpec, data: FoldData, choice: Choice, epsilon: float
) -> list[np.ndarray]:
    """Each text's TAD confidences from the chosen configuration trained without the text's fold."""
    confidences: list[np.ndarray] = [np.zeros(0)] * len(texts)
    index_of = {id(t): i for i, t in enumerate(texts)}
    for f in tqdm(range(data.count), desc="fit: out-of-fold TAD", unit="fold"):
        train, train_folds = data.texts_without(f, texts)
        available = [g for g in range(data.count) if g != f]
        stage1 = stage1_for_stage2(
            train, train_folds, data, available, choice.alpha_stage1, choice.variant, spec, epsilon
        )
        model = fit_ridge(
            stage2_stats(data.static_without(f), cross_stats(train, [stage1], spec), 0, spec), choice.alpha
        )
        scorer = TadScorer(model, spec, epsilon)
        for text in data.groups[f]:
            confidences[index_of[id(text)]] = scorer.confidences_of(text.token_trace()) if len(text) else np.zeros(0)
    return confidences


def measure_combiner(
    texts: Sequence[FitText],
    spec: FeatureSpec,
    data: FoldData,
    chosen_row: dict[str, Any],
    epsilon: float,
    selection: Selection,
    seed: int = 0,
) -> dict[str, Any]:
    """The sequence-level combiner against TAD alone on the same folds (an ablation: reported, not shipped)."""
    confidences = out_of_fold_confidences(texts, spec, data, Choice.of(chosen_row), epsilon)
    traces = [t.token_trace() for t in texts]
    features = np.array([combiner_inputs(trace, c) for trace, c in zip(traces, confidences, strict=True)])
    targets = np.array([t.target for t in texts])
    metric = selection_metric(selection, data.informative)

    def fold_metric(scores: np.ndarray, held: np.ndarray) -> float:
        return metric(scores, [texts[int(i)] for i in np.flatnonzero(held)])

    training_targets = np.array([t.training_target for t in texts])
    result = cross_validate_combiner(features, training_targets, data.fold_of, fold_metric)
    aggregation = Aggregation(chosen_row["aggregation"])
    tad = np.array([ranked(aggregate(c, aggregation)) for c in confidences])
    tad_folds = [fold_metric(tad[data.fold_of == f], data.fold_of == f) for f in range(data.count)]
    scores = {"tad": tad, "combined": result.scores, **baseline_table(traces)}
    table = per_dataset_prr(scores, targets, [t.dataset for t in texts])
    # Per dataset and prompt style: where, within a group, TAD is ahead of or behind each baseline.
    by_group = per_dataset_prr(scores, targets, [t.group for t in texts])
    return {
        **result.summary(),
        "tad_prr_folds": tad_folds,
        "gain_over_tad": paired_gain(result.fold_prr, tad_folds),
        "per_dataset": table,
        "informative_mean": {name: informative_mean(table, name) for name in scores},
        "per_group": by_group,
        "informative_group_mean": {name: informative_mean(by_group, name) for name in scores},
        "blend_out_of_fold": measure_out_of_fold(
            scores,
            targets,
            np.array([t.group for t in texts]),
            np.array([t.key for t in texts]),
            folds=data.count,
            seed=seed,
        ),
    }


def library_versions() -> dict[str, str]:
    """Versions that matter for unpickling the regressor and for the features."""
    from importlib.metadata import version

    return {name: version(name) for name in ("scikit-learn", "numpy", "torch", "transformers")}


@dataclass
class ConventionResult:
    """Cross-validation of every candidate under one attention convention."""

    spec: FeatureSpec
    data: FoldData
    table: list[dict[str, Any]]
    best: dict[str, dict[str, Any]]
    chosen_row: dict[str, Any]
    baselines: dict[Selection, dict[str, list[float]]]
    selection: Selection
    centring: TargetCentring = TargetCentring.NONE
    weighting: RowWeighting = RowWeighting.TOKEN
    texts: Sequence[FitText] = ()

    @property
    def prr(self) -> float:
        value = self.chosen_row["prr_mean"]
        return -math.inf if math.isnan(value) else float(value)

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
) -> ConventionResult:
    """Cross-validation under one feature spec, target centring and row weighting."""
    texts = weighted(centred(texts, centring), weighting)
    data = prepare_folds(texts, spec, options)
    candidates, baselines = cross_validate(texts, spec, data, options)
    selection = effective_selection(options.selection, data)
    table = cv_table(candidates, selection)
    best = best_per_variant(table)
    ranked = sorted(best.values(), key=lambda row: -math.inf if math.isnan(row["prr_mean"]) else row["prr_mean"])
    return ConventionResult(spec, data, table, best, ranked[-1], baselines, selection, centring, weighting, texts)


def paired_gain(trial: Sequence[float], base: Sequence[float]) -> dict[str, float | bool]:
    """Fold-by-fold PRR gain of a trial over the base (same folds); significant when its mean
    exceeds twice its standard error (roughly a one-sided 95% test over the folds)."""
    differences = np.array(trial, dtype=np.float64) - np.array(base, dtype=np.float64)
    differences = differences[np.isfinite(differences)]
    if len(differences) < 2:
        return {"mean": math.nan, "standard_error": math.nan, "significant": False}
    mean = float(differences.mean())
    error = float(differences.std(ddof=1) / math.sqrt(len(differences)))
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


def choose_convention(results: dict[Convention, ConventionResult]) -> Convention:
    """The authors' (generating) convention, unless the consuming one beats it by more than its CV std."""
    if len(results) == 1:
        return next(iter(results))
    generating, consuming = results[Convention.GENERATING], results[Convention.CONSUMING]
    margin = float(consuming.chosen_row["prr_std"])
    return Convention.CONSUMING if consuming.prr > generating.prr + margin else Convention.GENERATING


def run_fit(options: FitOptions) -> Manifest:
    started = time.monotonic()
    check_out(options.out, options.runs)
    loaded, settings, lags = load_runs(options.runs, options.n_lags)
    texts: Sequence[FitText] = loaded
    identity = ModelIdentity.model_validate(settings["identity"])
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
            texts, spec, options, centring=options.centrings[0], weighting=options.weightings[0]
        )
    base = result = results[choose_convention(results)]
    result, centrings = keep_by_trial_rule(
        result,
        result.centring.value,
        options.centrings[1:],
        lambda c: cross_validate_convention(texts, base.spec, options, centring=c, weighting=base.weighting),
    )
    base = result
    result, weightings = keep_by_trial_rule(
        result,
        result.weighting.value,
        options.weightings[1:],
        lambda w: cross_validate_convention(texts, base.spec, options, centring=base.centring, weighting=w),
    )
    texts = result.texts
    spec, data, table, best, chosen_row, baselines = (
        result.spec,
        result.data,
        result.table,
        result.best,
        result.chosen_row,
        result.baselines,
    )
    combiner = (
        measure_combiner(texts, spec, data, chosen_row, options.epsilon, result.selection, options.seed)
        if options.combiner
        else None
    )
    chosen = Choice.of(chosen_row)
    others = [Choice.of(best[v.value]) for v in options.variants if v is not chosen.variant and v.value in best]
    (stage1_main, stage2_main), *alternatives = fit_final(texts, spec, data, [chosen, *others], options.epsilon)
    aggregation = Aggregation(chosen_row["aggregation"])
    regressor_kind = "ridge"
    regressor_params: dict[str, Any] = {
        "alpha": chosen.alpha,
        "alpha_stage1": chosen.alpha_stage1,
        "target_centring": result.centring.value,
        "row_weighting": result.weighting.value,
    }
    mlp_summary: dict[str, Any] | None = None
    if options.mlp:
        best_mlp, best_average, mlp_table = mlp_search(texts, spec, data, chosen, options)
        mlp_summary = {"best": best_mlp, "grid": mlp_table, "width": options.mlp_width}
        # The paper's rule for its MLP: kept on a higher CV PRR than the ridge.
        mlp_kept = best_mlp is not None and best_mlp["prr_mean"] > chosen_row["prr_mean"]
        incumbent = best_mlp if mlp_kept and best_mlp is not None else chosen_row
        if best_average is not None:
            verdict = trial_verdict(best_average, incumbent, result.selection)
            forced = options.mlp_average_force and not verdict["kept"]
            mlp_summary["average"] = {
                "best": best_average,
                "against": "mlp" if mlp_kept else "ridge",
                **verdict,
                "installed_by_force": forced,
            }
            if verdict["kept"] or forced:
                best_mlp, mlp_kept = best_average, True
        if mlp_kept and best_mlp is not None:
            network = fit_final_mlp(texts, spec, data, chosen.variant, chosen.alpha_stage1, best_mlp, options)
            averaged = best_mlp.get("stage2") == "mlp+ridge"
            stage2_main = AveragedRegressor((stage2_main, network)) if averaged else network
            aggregation = Aggregation(best_mlp["aggregation"])
            regressor_kind = "mlp+ridge" if averaged else "mlp"
            regressor_params = {k: best_mlp[k] for k in MLP_CONFIG_KEYS}
            regressor_params.update(
                width=options.mlp_width,
                alpha_stage1=chosen.alpha_stage1,
                target_centring=result.centring.value,
                row_weighting=result.weighting.value,
            )
            if averaged:
                regressor_params["alpha"] = chosen.alpha

    # Written into a sibling folder and moved into place when complete (install_artifact): a fit killed
    # midway leaves --out as it was, never regressors without their manifest.
    out = options.out.parent / f".{options.out.name}.partial"
    shutil.rmtree(out, ignore_errors=True)  # a killed fit's leftovers
    out.mkdir(parents=True)
    joblib.dump(stage2_main, out / "regressor.joblib")
    joblib.dump(stage1_main, out / "stage1.joblib")
    for choice, (stage1_other, stage2_other) in zip(others, alternatives, strict=True):
        alternative_dir = out / "alternatives" / choice.variant.value
        alternative_dir.mkdir(parents=True, exist_ok=True)
        joblib.dump(stage2_other, alternative_dir / "regressor.joblib")
        joblib.dump(stage1_other, alternative_dir / "stage1.joblib")
    datasets: dict[str, int] = {}
    for text in texts:
        datasets[text.dataset] = datasets.get(text.dataset, 0) + 1
    manifest = Manifest(
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        llm=identity,
        features=FeatureInfo(
            order=spec.order,
            n_lags=spec.n_lags,
            num_layers=spec.num_layers,
            num_heads=spec.num_heads,
            convention=spec.convention,
            stage1_size=spec.stage1_size,
            stage2_size=spec.stage2_size,
        ),
        epsilon=options.epsilon,
        aggregation=aggregation,
        variant=chosen.variant.value,
        regressor=RegressorInfo(file="regressor.joblib", kind=regressor_kind, params=regressor_params),
        metrics={
            "cv": {
                "folds": options.folds,
                "split": f"by {options.fold_unit.value}",
                "seed": options.seed,
                "selection": f"mean PRR at 50% rejection over held-out folds ({SELECTION_WORDS[result.selection]})",
                "selection_metric": result.selection.value,
                "informative_groups": sorted(data.informative),
                "target_centring": result.centring.value,
                "centrings": centrings,
                "row_weighting": result.weighting.value,
                "weightings": weightings,
                "chosen": chosen_row,
                "best_per_variant": best,
                "convention": spec.convention.value,
                "conventions": {c.value: r.summary() for c, r in results.items()},
                "combiner": combiner,
                "convention_rule": "generating unless consuming's CV PRR exceeds it by more than consuming's CV std",
                "baselines": {
                    name: {
                        "prr_mean": _mean(v),
                        "prr_folds": v,
                        "pooled_prr_mean": _mean(baselines[Selection.POOLED][name]),
                        "within_group_prr_mean": _mean(baselines[Selection.WITHIN_GROUP][name]),
                    }
                    for name, v in baselines[result.selection].items()
                },
                "grid": table,
                "mlp": mlp_summary,
            },
            "alternatives": {
                choice.variant.value: {
                    "file": f"alternatives/{choice.variant.value}/regressor.joblib",
                    "alpha": choice.alpha,
                    "alpha_stage1": choice.alpha_stage1,
                    "aggregation": best[choice.variant.value]["aggregation"],
                }
                for choice in others
            },
        },
        training={
            "runs": [str(Path(p).resolve()) for p in options.runs],  # blend checks them wherever it runs
            "texts": len(texts),
            "tokens": int(sum(len(t) for t in texts)),
            "datasets": datasets,
            "fit_seconds": round(time.monotonic() - started, 1),
            "versions": library_versions(),
            "generation": {
                k: settings[k] for k in ("model", "data", "limit", "max_new_tokens", "prompts") if k in settings
            },
        },
    )
    written = write_manifest(out, manifest)
    install_artifact(out, options.out)
    return written
