"""Row weighting: every text weighs the same under `text`, the stage-2 Gram shortcut stays exact, fit records it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.uncertainty.features import FeatureSpec, stage2_features
from training.commands.fit import FitOptions, load_runs, run_fit
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
    assert combined.count == pytest.approx(direct.count)


def test_fit_cross_validates_row_weighting_and_records_its_choice(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    from app.uncertainty.artifact import load_artifact

    manifest = run_fit(
        FitOptions(
            runs=[tiny_runs["train"]],
            out=tmp_path / "a",
            alphas=(1.0,),
            extra_feature_sets=(),
            combiner=False,
            centrings=(TargetCentring.NONE,),
        )
    )
    cv = manifest.metrics["cv"]
    assert set(cv["weightings"]) == {"token", "text"}
    trial = cv["weightings"]["text"]
    kept = trial["gain"]["significant"] and trial["prr_mean"] > cv["weightings"]["token"]["prr_mean"]
    assert manifest.regressor.params["row_weighting"] == cv["row_weighting"] == ("text" if kept else "token")
    assert load_artifact(tmp_path / "a").manifest.regressor.params["row_weighting"] == cv["row_weighting"]
