"""Gradient-boosted trees as a third stage-2 member, fitted on an artifact's own stage-2 rows."""

from __future__ import annotations

from pathlib import Path

import joblib
import numpy as np
import pytest

from app.uncertainty.artifact import load_artifact
from app.uncertainty.features import FeatureSpec
from benchmarks.stage2_trees import main, subsampled_rows
from tests.artifacts import as_mlp_artifact
from training.commands.fit import load_runs
from training.two_stage import stage2_matrix
from training.weighting import RowWeighting, weighted


def test_subsampling_keeps_at_most_k_rows_of_each_text_and_its_total_weight(tiny_runs: dict[str, Path]) -> None:
    texts, _, lags = load_runs([tiny_runs["train"]], None)
    texts = weighted(texts, RowWeighting.TEXT)
    spec = FeatureSpec(n_lags=lags, num_layers=texts[0].attention.shape[1], num_heads=texts[0].attention.shape[2])
    rng = np.random.default_rng(1)
    confidences = [rng.uniform(size=len(t)) for t in texts]
    features, targets, weights = subsampled_rows(texts, confidences, spec, rows_per_text=3, seed=0)
    position = 0
    for text, text_confidences in zip(texts, confidences, strict=True):
        rows = max(len(text) - 1, 0)
        if rows == 0:
            continue
        kept = min(rows, 3)
        full, full_targets, _ = stage2_matrix([text], [text_confidences], spec)
        block = features[position : position + kept]
        # Each kept row is one of the text's own rows, none twice.
        matches = [int(np.flatnonzero((full == row).all(axis=1))[0]) for row in block]
        assert len(set(matches)) == kept
        np.testing.assert_array_equal(targets[position : position + kept], full_targets[matches])
        assert weights[position : position + kept].sum() == pytest.approx(text.row_weight * rows)
        position += kept
    assert position == len(targets) == len(weights)


def test_writes_three_loadable_artifacts_whose_stage_2_averages_its_members(
    tiny_artifact: Path, tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    averaged = as_mlp_artifact(tiny_artifact, tmp_path / "averaged", averaged=True)
    main(["--artifact", str(averaged), "--out", str(tmp_path / "out"), "--rows-per-text", "4", str(tiny_runs["train"])])
    assert "trees fitted" in capsys.readouterr().out
    ridge, mlp = joblib.load(averaged / "regressor.joblib").members
    trees = load_artifact(tmp_path / "out" / "trees-alone").scorer.regressor
    rows = np.random.default_rng(0).uniform(size=(5, int(trees.n_features_in_))).astype(np.float32)
    expected = {
        "trees3": (ridge.predict(rows) + mlp.predict(rows) + trees.predict(rows)) / 3,
        "trees-ridge": (ridge.predict(rows) + trees.predict(rows)) / 2,
        "trees-alone": trees.predict(rows),
    }
    for name, predictions in expected.items():
        artifact = load_artifact(tmp_path / "out" / name)
        np.testing.assert_allclose(artifact.scorer.regressor.predict(rows), predictions, rtol=1e-6)
        assert artifact.manifest.regressor.params["stage2_members"][-1] == "trees"
        assert not (tmp_path / "out" / name / "report").exists()


def test_refuses_an_artifact_whose_stage_2_is_not_a_ridge_and_an_mlp(
    tiny_artifact: Path, tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit):
        main(["--artifact", str(tiny_artifact), "--out", str(tmp_path / "out"), str(tiny_runs["train"])])
    assert not (tmp_path / "out").exists()
