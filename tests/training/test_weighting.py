"""Row weighting: every text weighs the same under `text`, the stage-2 Gram shortcut stays exact, fit records it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.uncertainty.features import FeatureSpec, stage2_features
from training.fit.options import FitOptions
from training.fit.pipeline import run_fit
from training.fit.report import read_cv_record
from training.fit.texts import load_runs
from training.groups import TargetCentring
from training.ridge import GramStats
from training.two_stage import FitText, cross_stats, stage2_stats, static_stats
from training.weighting import RowWeighting, weighted


def _varied_lengths(texts: list[FitText]) -> list[FitText]:
    """The tiny model always generates its length limit: cut the texts to 2..8 tokens."""
    cut = []
    for j, text in enumerate(texts):
        n = min(len(text), 2 + j % 7)
        stats = {name: values[:n] for name, values in text.stats.items()}
        cut.append(replace(text, probs=text.probs[:n], attention=text.attention[:n], stats=stats))
    return cut


def test_text_weighting_gives_every_text_the_same_weight_and_keeps_the_total(tiny_runs: dict[str, Path]) -> None:
    texts = _varied_lengths(load_runs([tiny_runs["train"]], None)[0])
    rows = np.array([max(len(t) - 1, 0) for t in texts])
    assert len(set(rows[rows > 0])) > 1  # the check below means something only for unequal lengths
    result = weighted(texts, RowWeighting.TEXT)
    per_text = np.array([t.row_weight * n for t, n in zip(result, rows, strict=True)])[rows > 0]
    np.testing.assert_allclose(per_text, per_text[0])
    assert per_text.sum() == pytest.approx(rows.sum())
    assert [t.target for t in result] == [t.target for t in texts]
    assert all(t.row_weight == 1.0 for t in weighted(result, RowWeighting.TOKEN))


def test_weighted_stage2_gram_from_blocks_equals_the_direct_weighted_gram(tiny_runs: dict[str, Path]) -> None:
    texts, _, lags = load_runs([tiny_runs["train"]], None)
    texts = weighted(_varied_lengths(texts), RowWeighting.TEXT)
    assert len({t.row_weight for t in texts}) > 1
    spec = FeatureSpec(lags, 3, 4)
    rng = np.random.default_rng(0)
    confidences = [rng.uniform(0.1, 1.0, size=len(t)) for t in texts]
    combined = stage2_stats(static_stats(texts, spec), cross_stats(texts, [confidences], spec), 0, spec)
    direct = GramStats.zeros(spec.stage2_size)
    for text, conf in zip(texts, confidences, strict=True):
        features = stage2_features(text.probs, conf, np.asarray(text.attention), spec)
        direct.add(features, text.rows_target(), text.rows_weight())
    np.testing.assert_allclose(combined.xtx, direct.xtx, rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(combined.xty, direct.xty, rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(combined.sum_x, direct.sum_x, rtol=1e-9, atol=1e-6)
    assert combined.sum_y == pytest.approx(direct.sum_y)
    assert combined.count == pytest.approx(direct.count)


def test_every_stage_fits_what_sklearn_ridge_fits_with_the_row_weights(
    tiny_runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stage 1, the authors' teacher-forced stage 1 and stage 2, streamed in chunks that split the texts,
    against `Ridge(sample_weight=...)` on the whole design matrix."""
    from sklearn.linear_model import Ridge

    import training.two_stage as two_stage
    from app.uncertainty.features import stage1_features
    from training.ridge import fit_ridge

    monkeypatch.setattr(two_stage, "CHUNK_ROWS", 7)
    texts, _, lags = load_runs([tiny_runs["train"]], None)
    texts = [t for t in weighted(_varied_lengths(texts), RowWeighting.TEXT) if len(t) > 1]
    spec = FeatureSpec(lags, 3, 4)
    weights = np.concatenate([t.rows_weight() for t in texts])
    targets = np.concatenate([t.rows_target() for t in texts])
    static = two_stage.static_stats(texts, spec)
    rng = np.random.default_rng(1)
    confidences = [rng.uniform(0.1, 1.0, size=len(t)) for t in texts]
    forced = [np.full(len(t), t.training_target) for t in texts]
    cases = {
        "stage 1": (
            two_stage.stage1_stats(texts, spec),
            np.concatenate([stage1_features(t.probs, lags) for t in texts]),
        ),
        "teacher-forced stage 1": (
            two_stage.teacher_forced_stats(texts, static, spec),
            np.concatenate(
                [stage2_features(t.probs, c, np.asarray(t.attention), spec) for t, c in zip(texts, forced, strict=True)]
            ),
        ),
        "stage 2": (
            stage2_stats(static, cross_stats(texts, [confidences], spec), 0, spec),
            two_stage.stage2_matrix(texts, confidences, spec)[0],
        ),
    }
    for name, (stats, design) in cases.items():
        reference = Ridge(alpha=0.1).fit(design.astype(np.float64), targets, sample_weight=weights)
        model = fit_ridge(stats, 0.1)
        np.testing.assert_allclose(model.coef_, reference.coef_, rtol=1e-5, atol=1e-8, err_msg=name)
        assert model.intercept_ == pytest.approx(reference.intercept_, rel=1e-5, abs=1e-8), name
        assert stats.count == pytest.approx(weights.sum()), name


def test_fit_cross_validates_row_weighting_and_records_its_choice(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    from app.uncertainty.artifact import load_artifact

    manifest = run_fit(
        FitOptions(
            runs=[tiny_runs["train"]],
            out=tmp_path / "a",
            alphas=(1.0,),
            centrings=(TargetCentring.NONE,),
        )
    )
    cv = read_cv_record(tmp_path / "a", manifest)
    assert set(cv["weightings"]) == {"token", "text"}
    trial = cv["weightings"]["text"]
    kept = trial["kept"]
    assert manifest.regressor.params["row_weighting"] == cv["row_weighting"] == ("text" if kept else "token")
    assert load_artifact(tmp_path / "a").manifest.regressor.params["row_weighting"] == cv["row_weighting"]
