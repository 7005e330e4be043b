"""Cross-validation's building blocks: the Gram shortcut is exact, and the variants differ where METHOD.md says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.uncertainty.features import FeatureSpec, stage1_features, stage2_features
from training.fit.options import FitOptions
from training.fit.texts import load_runs
from training.ridge import GramStats, fit_ridge
from training.two_stage import (
    Variant,
    confidence_lags,
    cross_stats,
    stage1_confidences,
    stage2_stats,
    static_stats,
)


def test_stage2_gram_from_blocks_equals_the_direct_gram(tiny_runs: dict[str, Path]) -> None:
    texts, _, lags = load_runs([tiny_runs["train"]], None)
    spec = FeatureSpec(lags, 3, 4)
    stats1 = GramStats.zeros(spec.stage1_size)
    for text in texts:
        stats1.add(stage1_features(text.probs, lags), text.rows_target())
    model = fit_ridge(stats1, 0.1)
    probability_only = (Variant.LEAK_FREE, Variant.ALGORITHM1_LITERAL)
    candidates = [[stage1_confidences(t, model, variant, spec, 1e-4) for t in texts] for variant in probability_only]
    static, cross = static_stats(texts, spec), cross_stats(texts, candidates, spec)
    for k, confidences in enumerate(candidates):
        direct = GramStats.zeros(spec.stage2_size)
        for text, conf in zip(texts, confidences, strict=True):
            direct.add(stage2_features(text.probs, conf, np.asarray(text.attention), spec), text.rows_target())
        combined = stage2_stats(static, cross, k, spec)
        np.testing.assert_allclose(combined.xtx, direct.xtx, rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(combined.xty, direct.xty, rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(combined.sum_x, direct.sum_x, rtol=1e-9, atol=1e-6)


def test_variants_set_the_first_confidence_as_method_md_says(tiny_runs: dict[str, Path]) -> None:
    texts, _, lags = load_runs([tiny_runs["train"]], None)
    text = next(t for t in texts if len(t) > 2)
    stats = GramStats.zeros(lags + 1)
    stats.add(stage1_features(text.probs, lags), text.rows_target())
    model = fit_ridge(stats, 1.0)
    exact = stage1_confidences(text, model, Variant.ALGORITHM1_LITERAL, FeatureSpec(lags, 3, 4), 1e-4)
    free = stage1_confidences(text, model, Variant.LEAK_FREE, FeatureSpec(lags, 3, 4), 1e-4)
    assert exact[0] == text.target and free[0] == np.float32(text.probs[0])
    np.testing.assert_array_equal(exact[1:], free[1:])
    lagged = confidence_lags(exact, lags)
    assert lagged[0, 0] == np.float32(exact[0]) and lagged[0, 1:].sum() == 0


def test_authors_stage1_is_teacher_forced_and_stage2_gets_the_servers_recurrent_confidences(
    tiny_runs: dict[str, Path],
) -> None:
    from app.uncertainty.tad import TadScorer
    from training.fit.cross_validation import prepare_folds, stage1_for_stage2

    texts, _, lags = load_runs([tiny_runs["train"]], None)
    spec = FeatureSpec(lags, 3, 4)
    direct = GramStats.zeros(spec.stage2_size)
    for text in texts:
        forced = np.full(len(text), text.target)
        direct.add(stage2_features(text.probs, forced, np.asarray(text.attention), spec), text.rows_target())
    options = FitOptions(runs=[tiny_runs["train"]], out=Path("unused"))
    data = prepare_folds(texts, spec, options)
    total = sum(data.teacher_forced[1:], data.teacher_forced[0])
    np.testing.assert_allclose(total.xtx, direct.xtx, rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(total.xty, direct.xty, rtol=1e-9, atol=1e-6)
    # Out-of-fold: each text's confidences come from the model fitted without its fold, applied as served.
    available = list(range(data.count))
    confidences = stage1_for_stage2(texts, data.fold_of, data, available, 1.0, Variant.AUTHORS, spec, 1e-4)
    index = next(i for i, t in enumerate(texts) if len(t) > 2)
    fold = int(data.fold_of[index])
    model = fit_ridge(total - data.teacher_forced[fold], 1.0)
    served = TadScorer(model, spec, 1e-4).confidences(texts[index].logprobs, np.asarray(texts[index].attention))
    np.testing.assert_allclose(confidences[index], served, rtol=1e-12)
    assert confidences[index][0] == np.float32(texts[index].probs[0])  # c_1 = p_1, as at inference


def test_within_group_selection_without_an_informative_group_falls_back_to_pooled_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from types import SimpleNamespace

    from training.fit.cross_validation import effective_selection
    from training.groups import Selection

    informative = SimpleNamespace(informative=["squad"])
    assert effective_selection(Selection.WITHIN_GROUP, informative) is Selection.WITHIN_GROUP  # type: ignore[arg-type]
    assert not caplog.records
    none = SimpleNamespace(informative=[])
    assert effective_selection(Selection.WITHIN_GROUP, none) is Selection.POOLED  # type: ignore[arg-type]
    assert "selected by pooled PRR instead of within-group PRR" in caplog.text
