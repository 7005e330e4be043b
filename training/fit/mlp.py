"""The optional stage-2 MLP (`fit --mlp`): the paper's grid on the ridge's folds, and which stage 2 is installed.

Stage 1 stays the chosen ridge. The MLP replaces the ridge stage 2 on a higher CV PRR alone, as the paper
selects; an MLP averaged with the ridge (`--mlp-average`) replaces what was kept so far only under the trial
rule (training/fit/trial_rule.py), or when forced. Unlike the ridge path this holds one fold's training
matrix in memory.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from app.uncertainty.aggregation import Aggregation
from app.uncertainty.features import FeatureSpec
from app.uncertainty.tad import AveragedRegressor, Regressor, TadScorer
from training.fit.cross_validation import (
    FOLDS_KEY,
    Choice,
    ConventionResult,
    FoldData,
    effective_selection,
    held_out_prr,
    mean_finite,
    prr_order,
    stage1_for_stage2,
)
from training.fit.fold_progress import FoldProgress, FoldScores
from training.fit.options import MLP_CONFIG_KEYS, FitOptions
from training.fit.trial_rule import trial_verdict
from training.groups import Selection
from training.ridge import fit_ridge
from training.two_stage import FitText, Variant, cross_stats, stage2_matrix, stage2_stats

if TYPE_CHECKING:
    from sklearn.neural_network import MLPRegressor


def mlp_search(
    texts: Sequence[FitText], spec: FeatureSpec, data: FoldData, choice: Choice, options: FitOptions
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, list[dict[str, Any]]]:
    """The paper's grid for a stage-2 MLP on the same folds and selection as the ridge.

    Returns the best MLP row, the best row of an MLP averaged with the chosen ridge stage 2 (None unless
    `options.mlp_average`) and every row.
    """
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
    progress = FoldProgress(options, choice, spec, texts, data)
    for f in tqdm(range(data.count), desc="fit: MLP cross-validation", unit="fold"):
        fold_scores = progress.load(f)
        if fold_scores is None or set(fold_scores) != set(scores):
            fold_scores = _fold_scores(texts, spec, data, choice, options, configs, f)
            progress.save(f, fold_scores)
        for key, by_metric in fold_scores.items():
            for metric, by_aggregation in by_metric.items():
                for aggregation, value in by_aggregation.items():
                    scores[key][metric][aggregation].append(value)
    table: list[dict[str, Any]] = [
        {
            "stage2": kind,
            **config,
            "aggregation": aggregation.value,
            "prr_mean": mean_finite(scores[kind, c][selection][aggregation]),
            "prr_folds": scores[kind, c][selection][aggregation],
            **{FOLDS_KEY[metric]: scores[kind, c][metric][aggregation] for metric in Selection},
        }
        for kind in kinds
        for c, config in enumerate(configs)
        for aggregation in Aggregation
    ]

    def best_of(kind: str) -> dict[str, Any] | None:
        return max((row for row in table if row["stage2"] == kind), key=prr_order, default=None)

    return best_of("mlp"), best_of("mlp+ridge"), table


def _fold_scores(
    texts: Sequence[FitText],
    spec: FeatureSpec,
    data: FoldData,
    choice: Choice,
    options: FitOptions,
    configs: Sequence[dict[str, Any]],
    f: int,
) -> FoldScores:
    """Every configuration's held-out PRRs on fold `f`, fitted on the other folds."""
    train, train_folds = data.texts_without(f, texts)
    available = [g for g in range(data.count) if g != f]
    variant, alpha = choice.variant, choice.alpha_stage1
    confidences = stage1_for_stage2(train, train_folds, data, available, alpha, variant, spec, options.epsilon)
    ridge = None
    if options.mlp_average:
        stats = stage2_stats(data.static_without(f), cross_stats(train, [confidences], spec), 0, spec)
        ridge = fit_ridge(stats, choice.alpha)
    features, targets, weights = stage2_matrix(train, confidences, spec)
    scores: FoldScores = {}
    for c, config in enumerate(configs):
        network = fit_mlp(config, options, features, targets, weights)
        stage2: dict[str, Regressor] = {"mlp": network}
        if ridge is not None:
            stage2["mlp+ridge"] = AveragedRegressor((ridge, network))
        for kind, regressor in stage2.items():
            scorer = TadScorer(regressor, spec, options.epsilon)
            scores[kind, c] = held_out_prr(scorer, data.groups[f], data.informative)
    return scores


def fit_mlp(
    config: dict[str, Any], options: FitOptions, features: np.ndarray, targets: np.ndarray, weights: np.ndarray | None
) -> MLPRegressor:
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
    """The MLP stage 2 of `config` on all texts, trained on stage-1 confidences as the cross-validation made them."""
    available = list(range(data.count))
    confidences = stage1_for_stage2(texts, data.fold_of, data, available, alpha, variant, spec, options.epsilon)
    features, targets, weights = stage2_matrix(texts, confidences, spec)
    return fit_mlp(config, options, features, targets, weights)


@dataclass(frozen=True)
class Stage2:
    """The stage 2 an artifact serves: its regressor, its kind and parameters as the manifest records them, the
    aggregation chosen with it, and its row of the cross-validation."""

    regressor: Regressor
    kind: str  # "ridge", "mlp" or "mlp+ridge"
    params: dict[str, Any]
    aggregation: Aggregation


def choose_stage2(
    result: ConventionResult, ridge: Regressor, options: FitOptions
) -> tuple[Stage2, dict[str, Any] | None]:
    """The stage 2 to install: the chosen `ridge` (fitted on all texts), or with `options.mlp` the MLP or its
    average with that ridge where the rules keep one. Also the MLP search's record (None without `--mlp`)."""
    chosen_row = result.chosen_row
    chosen = Choice.of(chosen_row)
    shared = {"target_centring": result.centring.value, "row_weighting": result.weighting.value}
    ridge_params = {"alpha": chosen.alpha, "alpha_stage1": chosen.alpha_stage1, **shared}
    kept = Stage2(ridge, "ridge", ridge_params, Aggregation(chosen_row["aggregation"]))
    if not options.mlp:
        return kept, None
    texts, spec, data = result.texts, result.spec, result.data
    best_mlp, best_average, mlp_table = mlp_search(texts, spec, data, chosen, options)
    record: dict[str, Any] = {"best": best_mlp, "grid": mlp_table, "width": options.mlp_width}
    # The paper's rule for its MLP: kept on a higher CV PRR than the ridge.
    mlp_kept = best_mlp is not None and best_mlp["prr_mean"] > chosen_row["prr_mean"]
    incumbent = best_mlp if mlp_kept and best_mlp is not None else chosen_row
    if best_average is not None:
        verdict = trial_verdict(best_average, incumbent, result.selection)
        forced = options.mlp_average_force and not verdict["kept"]
        record["average"] = {
            "best": best_average,
            "against": "mlp" if mlp_kept else "ridge",
            **verdict,
            "installed_by_force": forced,
        }
        if verdict["kept"] or forced:
            best_mlp, mlp_kept = best_average, True
    if not (mlp_kept and best_mlp is not None):
        return kept, record
    network = fit_final_mlp(texts, spec, data, chosen.variant, chosen.alpha_stage1, best_mlp, options)
    averaged = best_mlp.get("stage2") == "mlp+ridge"
    params = {k: best_mlp[k] for k in MLP_CONFIG_KEYS}
    params.update(width=options.mlp_width, alpha_stage1=chosen.alpha_stage1, **shared)
    if averaged:
        params["alpha"] = chosen.alpha
    regressor = AveragedRegressor((ridge, network)) if averaged else network
    kind = "mlp+ridge" if averaged else "mlp"
    return Stage2(regressor, kind, params, Aggregation(best_mlp["aggregation"])), record
