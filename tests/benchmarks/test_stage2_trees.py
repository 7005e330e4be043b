"""Gradient-boosted trees as a third stage-2 member, fitted on an artifact's own stage-2 rows."""

from __future__ import annotations

from pathlib import Path

import joblib
import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingRegressor

from app.uncertainty.artifact import load_artifact, read_manifest
from app.uncertainty.features import FeatureSpec
from benchmarks.stage2_trees import main, subsampled_rows
from tests.artifacts import as_mlp_artifact
from training.commands.fit import FitOptions, load_runs, run_fit
from training.groups import TargetCentring
from training.ridge import GramStats, fit_ridge
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


@pytest.fixture(scope="module")
def centred_weighted_artifact(tiny_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny runs fitted with a quarter centring and text weighting, stage 2 a ridge averaged with an MLP."""
    folder = tmp_path_factory.mktemp("trees")
    options = FitOptions(
        runs=[tiny_runs["train"]],
        out=folder / "ridge",
        alphas=(1.0,),
        centrings=(TargetCentring.GROUP_QUARTER,),
        weightings=(RowWeighting.TEXT,),
        extra_feature_sets=(),
        combiner=False,
    )
    run_fit(options)
    return as_mlp_artifact(folder / "ridge", folder / "averaged", averaged=True)


def test_the_trees_see_the_rows_the_artifacts_ridge_was_fitted_on(
    centred_weighted_artifact: Path, tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    original_fit = HistGradientBoostingRegressor.fit

    def recording_fit(
        self: HistGradientBoostingRegressor, features: np.ndarray, targets: np.ndarray, sample_weight: np.ndarray
    ) -> HistGradientBoostingRegressor:
        seen.append((features, targets, sample_weight))
        return original_fit(self, features, targets, sample_weight=sample_weight)

    monkeypatch.setattr(HistGradientBoostingRegressor, "fit", recording_fit)
    out = tmp_path / "out"
    main(
        [
            "--artifact",
            str(centred_weighted_artifact),
            "--out",
            str(out),
            "--rows-per-text",
            "1000",
            str(tiny_runs["train"]),
        ]
    )
    ((features, targets, weights),) = seen
    manifest = read_manifest(centred_weighted_artifact)
    assert manifest.regressor.params["target_centring"] == "group-0.25"
    assert manifest.regressor.params["row_weighting"] == "text"
    # All rows kept: a ridge on them with the artifact's alpha is the artifact's own ridge.
    stats = GramStats.zeros(features.shape[1])
    stats.add(features, targets, weights)
    refitted = fit_ridge(stats, float(manifest.regressor.params["alpha"]))
    ridge, _ = joblib.load(centred_weighted_artifact / "regressor.joblib").members
    np.testing.assert_allclose(refitted.coef_, ridge.coef_, rtol=1e-6, atol=1e-9)
    assert refitted.intercept_ == pytest.approx(ridge.intercept_, rel=1e-6, abs=1e-9)


def test_writes_three_loadable_artifacts_whose_stage_2_averages_its_members(
    centred_weighted_artifact: Path, tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    averaged = centred_weighted_artifact
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
    members = {"trees3": ["ridge", "mlp", "trees"], "trees-ridge": ["ridge", "trees"], "trees-alone": ["trees"]}
    for name, predictions in expected.items():
        artifact = load_artifact(tmp_path / "out" / name)
        np.testing.assert_allclose(artifact.scorer.regressor.predict(rows), predictions, rtol=1e-6)
        params = artifact.manifest.regressor.params
        assert params["stage2_members"] == members[name]
        assert ("layers" in params) == ("mlp" in members[name]) and ("alpha" in params) == ("ridge" in members[name])
        assert artifact.manifest.regressor.kind == "mlp+ridge"  # the schema's: the copies are for evaluate only
        assert artifact.manifest.thresholds == {} and artifact.manifest.default_target is None
        assert not (tmp_path / "out" / name / "report").exists()


@pytest.mark.parametrize("stage2", ["ridge", "mlp", "two seeds of an mlp"])
def test_refuses_an_artifact_whose_stage_2_is_not_a_ridge_and_an_mlp(
    stage2: str, tiny_artifact: Path, tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    artifact = tiny_artifact
    if stage2 != "ridge":
        artifact = as_mlp_artifact(tiny_artifact, tmp_path / "mlp", seeds=2 if "seeds" in stage2 else 1)
    with pytest.raises(SystemExit):
        main(["--artifact", str(artifact), "--out", str(tmp_path / "out"), str(tiny_runs["train"])])
    assert not (tmp_path / "out").exists()


def test_refuses_runs_other_than_the_artifacts_training_runs(
    centred_weighted_artifact: Path, tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit, match="give its training runs"):
        main(["--artifact", str(centred_weighted_artifact), "--out", str(tmp_path / "out"), str(tiny_runs["dev"])])
    assert not (tmp_path / "out").exists()
