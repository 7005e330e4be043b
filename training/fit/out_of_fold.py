"""What `fit` measures and never serves, on out-of-fold TAD scores of the chosen configuration: the
sequence-level combiner over TAD and the baselines (training/combiner.py), and `blend`'s grid (would a
decision blend help, judged on every training answer; training/blending.py). `--no-combiner` skips both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from tqdm import tqdm

from app.uncertainty.aggregation import Aggregation, aggregate
from app.uncertainty.features import FeatureSpec
from app.uncertainty.tad import TadScorer
from training.blending import measure_out_of_fold
from training.combiner import combiner_inputs, cross_validate_combiner, informative_mean, per_dataset_prr
from training.fit.cross_validation import Choice, FoldData, stage1_for_stage2
from training.fit.trial_rule import paired_gain
from training.groups import Selection, selection_metric
from training.method_scores import baseline_table, ranked
from training.ridge import fit_ridge
from training.two_stage import FitText, cross_stats, stage2_stats


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
