"""The paper's MLP grid a line at a time: snapshots of one fit, scored on an artifact's own folds."""

from __future__ import annotations

import json
import warnings
import zlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor

import training.commands.fit as fit_module
from app.uncertainty.artifact import load_artifact
from benchmarks import artifact_stage2, mlp_epochs
from benchmarks.artifact_stage2 import artifact_folds
from benchmarks.mlp_epochs import (
    EpochSnapshots,
    check_reproduced,
    fold_rows,
    main,
    mlp_config,
    mlp_snapshots,
    recorded_fold_prr,
    row_key,
)
from tests.artifacts import as_mlp_artifact
from training.commands.fit import FitOptions, run_fit
from training.groups import TargetCentring
from training.two_stage import FitText
from training.weighting import RowWeighting

CONFIG = {"layers": 2, "epochs": 3, "learning_rate": 1e-3, "batch_size": 64}


def test_each_snapshot_is_the_network_fitted_with_that_many_epochs() -> None:
    rng = np.random.default_rng(0)
    features = rng.normal(size=(600, 12))
    targets = features[:, 0] * 0.3 + rng.normal(size=600) * 0.1
    weights = rng.uniform(0.5, 2.0, size=600)
    snapshots = mlp_snapshots(CONFIG, 8, 0, [2, 5, 9], features, targets, weights)
    assert sorted(snapshots) == [2, 5, 9]
    for epochs, snapshot in snapshots.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            fitted = MLPRegressor(
                hidden_layer_sizes=(8, 8), learning_rate_init=1e-3, max_iter=epochs, batch_size=64, random_state=0
            ).fit(features, targets, sample_weight=weights)
        assert type(snapshot) is MLPRegressor and snapshot.n_iter_ == epochs == snapshot.max_iter
        for ours, theirs in zip(
            snapshot.coefs_ + snapshot.intercepts_, fitted.coefs_ + fitted.intercepts_, strict=True
        ):
            np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_array_equal(snapshot.predict(features), fitted.predict(features))


def _with_coin_targets(load: Callable[..., tuple[list[FitText], Any, int]]) -> Callable[..., Any]:
    """`load_runs` with every text right or wrong by a coin fixed by its key: the tiny model is always wrong,
    and a PRR over constant targets is undefined, which would make any comparison of PRRs pass."""

    def loading(*args: Any, **kwargs: Any) -> tuple[list[FitText], Any, int]:
        texts, settings, lags = load(*args, **kwargs)
        return [replace(t, target=float(zlib.crc32(t.key.encode()) % 2)) for t in texts], settings, lags

    return loading


def test_an_epoch_count_past_a_stop_on_a_flat_loss_gets_the_stopped_network() -> None:
    features = np.random.default_rng(0).normal(size=(300, 6))
    targets = np.zeros(300)  # the loss flattens at once: scikit-learn stops after 40 epochs
    config = {"layers": 1, "learning_rate": 1e-2, "batch_size": 64}
    snapshots = mlp_snapshots(config, 4, 0, [5, 60], features, targets, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fitted = MLPRegressor(
            hidden_layer_sizes=(4,), learning_rate_init=1e-2, batch_size=64, max_iter=60, random_state=0
        ).fit(features, targets)
    assert fitted.n_iter_ < 60 and snapshots[60].n_iter_ == fitted.n_iter_ and snapshots[5].n_iter_ == 5
    np.testing.assert_array_equal(snapshots[60].predict(features), fitted.predict(features))


def test_refuses_snapshots_that_were_not_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if scikit-learn renamed the hook: training runs, but no copy is taken at the end of an epoch.
    monkeypatch.setattr(EpochSnapshots, "_update_no_improvement_count", MLPRegressor._update_no_improvement_count)
    rng = np.random.default_rng(0)
    features, targets = rng.normal(size=(200, 5)), rng.normal(size=200)
    with pytest.raises(RuntimeError, match="no snapshot"):
        mlp_snapshots(CONFIG, 4, 0, [1, 2], features, targets, None)


@pytest.fixture(scope="module")
def averaged_artifact(tiny_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The tiny runs, with coin targets, fitted as the default artifact is: quarter centring, text weighting,
    a ridge and an MLP averaged, with fit's own MLP cross-validation recorded in the manifest. The coin
    targets stay in place for the module's tests, which load the runs again."""
    out = tmp_path_factory.mktemp("epochs") / "averaged"
    with pytest.MonkeyPatch.context() as patch:
        loading = _with_coin_targets(fit_module.load_runs)
        patch.setattr(fit_module, "load_runs", loading)
        patch.setattr(artifact_stage2, "load_runs", loading)
        _fit_averaged(tiny_runs, out)
        yield out


def _fit_averaged(tiny_runs: dict[str, Path], out: Path) -> None:
    run_fit(
        FitOptions(
            runs=[tiny_runs["train"]],
            out=out,
            alphas=(1.0,),
            centrings=(TargetCentring.GROUP_QUARTER,),
            weightings=(RowWeighting.TEXT,),
            mlp=True,
            mlp_width=16,
            mlp_grid={key: (value,) for key, value in CONFIG.items()},
            mlp_average=True,
            mlp_average_force=True,
            extra_feature_sets=(),
            combiner=False,
        )
    )


def test_a_fold_at_the_artifacts_own_epochs_reproduces_fits_cross_validation(
    averaged_artifact: Path, tiny_runs: dict[str, Path]
) -> None:
    artifact = load_artifact(averaged_artifact)
    assert artifact.manifest.regressor.kind == "mlp+ridge"
    folds = artifact_folds(artifact, [tiny_runs["train"]])
    recorded = artifact.manifest.metrics["cv"]["mlp"]["grid"]
    assert len(artifact.manifest.metrics["cv"]["informative_groups"]) == 2  # PRRs within groups are defined
    for fold in (0, 3):
        rows = fold_rows(artifact, folds, fold, [int(CONFIG["epochs"]), 6], folds.options.seed)
        assert {(row["epochs"], row["stage2"]) for row in rows} == {
            (e, k) for e in (3, 6) for k in ("mlp", "mlp+ridge")
        }
        assert {row["layers"] for row in rows} == {CONFIG["layers"]}
        for row in (row for row in rows if row["epochs"] == CONFIG["epochs"]):
            for cv_row in (r for r in recorded if r["stage2"] == row["stage2"]):
                aggregation = cv_row["aggregation"]
                assert _same(row["within-group"][aggregation], cv_row["within_group_prr_folds"][fold])
                assert _same(row["pooled"][aggregation], cv_row["pooled_prr_folds"][fold])


def _same(ours: float, recorded: float | None) -> bool:
    """A PRR equal to the manifest's (which writes NaN, a fold with no informative group, as null)."""
    return np.isnan(ours) if recorded is None else ours == pytest.approx(recorded, abs=1e-12)


def test_main_appends_per_fold_rows_and_a_rerun_skips_the_folds_done(
    averaged_artifact: Path, tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cv.jsonl"
    args = [str(tiny_runs["train"]), "--artifact", str(averaged_artifact), "--out", str(out), "--epochs", "1", "2"]
    main([*args, "--folds", "1", "--layers", "1"])
    first = out.read_text().splitlines()
    assert {json.loads(line)["layers"] for line in first} == {1}
    main([*args, "--folds", "1"])  # the artifact's 2 layers: not yet there, so fold 1 runs again
    first = out.read_text().splitlines()
    assert [json.loads(line)["layers"] for line in first] == [1] * 4 + [2] * 4
    args = [*args, "--layers", "1"]
    assert [(json.loads(line)["fold"], json.loads(line)["epochs"]) for line in first[:4]] == [
        (1, 1),
        (1, 1),
        (1, 2),
        (1, 2),
    ]
    main([*args, "--folds", "1", "2"])
    lines = out.read_text().splitlines()
    assert lines[:8] == first and {json.loads(line)["fold"] for line in lines[8:]} == {2}
    assert "fold 1: already in" in capsys.readouterr().out


def test_another_learning_rate_or_batch_is_another_grid_point_recorded_and_resumed_apart(
    averaged_artifact: Path, tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cv.jsonl"
    args = [str(tiny_runs["train"]), "--artifact", str(averaged_artifact), "--out", str(out), "--epochs", "1"]
    main([*args, "--folds", "1"])
    main([*args, "--folds", "1", "--learning-rate", "0.002"])  # not the artifact's 1e-3: runs again
    main([*args, "--folds", "1", "--batch-size", "8"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["learning_rate"], r["batch_size"]) for r in rows] == [(1e-3, 64)] * 2 + [(2e-3, 64)] * 2 + [
        (1e-3, 8)
    ] * 2
    pooled = [row["pooled"]["mean-log"] for row in rows if row["stage2"] == "mlp"]
    assert np.isfinite(pooled).all() and len(set(pooled)) == 3  # the rate and the batch reached the fit
    capsys.readouterr()
    main([*args, "--folds", "1", "--learning-rate", "0.002"])
    assert "fold 1: already in" in capsys.readouterr().out and len(out.read_text().splitlines()) == 6


def test_the_manifests_prrs_to_reproduce_are_those_of_its_own_grid_point_and_one_seed(
    averaged_artifact: Path,
) -> None:
    artifact = load_artifact(averaged_artifact)
    own = recorded_fold_prr(artifact, 2)
    grid = artifact.manifest.metrics["cv"]["mlp"]["grid"]
    assert own and len(own) == len(grid)  # the fixture searched one point
    shifted = [{**row, "within_group_prr_folds": [0.5] * 5} for row in grid]
    # a searched grid records other points and seed averages too, here after the artifact's own
    grid.extend({**row, "learning_rate": 3e-3} for row in shifted)
    grid.extend({**row, "seeds": 2} for row in shifted)
    assert recorded_fold_prr(artifact, 2) == own


def test_rows_written_before_rate_and_batch_were_recorded_are_keyed_as_the_artifacts(
    averaged_artifact: Path,
) -> None:
    artifact = load_artifact(averaged_artifact)
    legacy = {"fold": 0, "layers": 2, "epochs": 3}
    assert row_key(artifact, legacy) == (0, 2, 1e-3, 64, 3)
    assert row_key(artifact, {**legacy, "learning_rate": 1e-5, "batch_size": 128}) == (0, 2, 1e-5, 128, 3)


def test_an_unknown_or_invalid_grid_setting_is_refused(
    averaged_artifact: Path, tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    artifact = load_artifact(averaged_artifact)
    assert mlp_config(artifact, {"learning_rate": None, "batch_size": 128})["batch_size"] == 128
    with pytest.raises(ValueError, match="width"):
        mlp_config(artifact, {"width": 64})
    out = tmp_path / "cv.jsonl"
    args = [str(tiny_runs["train"]), "--artifact", str(averaged_artifact), "--out", str(out)]
    for flag, value, reason in (
        ("--learning-rate", "0", "--learning-rate must be"),
        ("--batch-size", "0", "--batch-size"),
    ):
        with pytest.raises(SystemExit):
            main([*args, flag, value])
        assert reason in capsys.readouterr().err
    assert not out.exists()


def test_refuses_what_it_cannot_measure_as_fit_did(
    tiny_artifact: Path,
    averaged_artifact: Path,
    tiny_runs: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "cv.jsonl"
    train = str(tiny_runs["train"])
    two_seeds = as_mlp_artifact(tiny_artifact, tmp_path / "seeds", averaged=True, seeds=2)
    refused = [
        ([train, "--artifact", str(tiny_artifact)], "mean of a ridge and an MLP"),
        ([train, "--artifact", str(two_seeds)], "several seeds"),
        ([train, "--artifact", str(averaged_artifact), "--folds", "7"], "5 folds, not [7]"),
    ]
    for args, reason in refused:
        with pytest.raises(SystemExit):
            main([*args, "--out", str(out)])
        assert reason in capsys.readouterr().err
    for runs in ([str(tiny_runs["dev"])], [train, train]):  # other runs; the same run twice
        with pytest.raises(SystemExit, match="give its training runs"):
            main([*runs, "--artifact", str(averaged_artifact), "--out", str(out)])
    assert not out.exists()


def test_rows_of_the_artifacts_own_configuration_must_reproduce_its_manifest(
    averaged_artifact: Path, tiny_runs: dict[str, Path]
) -> None:
    artifact = load_artifact(averaged_artifact)
    folds = artifact_folds(artifact, [tiny_runs["train"]])
    rows = fold_rows(artifact, folds, 2, [int(CONFIG["epochs"])], folds.options.seed)
    check_reproduced(artifact, rows)
    off = [
        {**row, "within-group": {**row["within-group"], "mean-log": 0.01 + row["within-group"]["mean-log"]}}
        for row in rows
    ]
    with pytest.raises(SystemExit, match="does not reproduce"):
        check_reproduced(artifact, off)
    for other in ({"learning_rate": 2e-3}, {"batch_size": 32}, {"layers": 1}):  # other grid points: not checked
        check_reproduced(artifact, [{**row, **other} for row in off])


def test_write_refits_the_artifacts_own_mlp_to_the_bit_and_writes_a_copy_per_epoch_count(
    averaged_artifact: Path, tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "copies"
    main([str(tiny_runs["train"]), "--artifact", str(averaged_artifact), "--write", str(out), "--epochs", "3", "5"])
    printed = capsys.readouterr().out
    assert "layers-2-epochs-3-lr-0.001-batch-64 (its MLP is the artifact's own: True)" in printed
    assert "layers-2-epochs-5-lr-0.001-batch-64 (its MLP is the artifact's own: False)" in printed
    ridge, own = joblib.load(averaged_artifact / "regressor.joblib").members
    rows = np.random.default_rng(0).uniform(size=(4, int(own.n_features_in_)))
    for epochs in (3, 5):
        copy = load_artifact(out / f"layers-2-epochs-{epochs}-lr-0.001-batch-64")
        copied_ridge, network = copy.scorer.regressor.members  # type: ignore[attr-defined]
        assert network.n_iter_ == epochs and copy.manifest.regressor.params["epochs"] == epochs
        np.testing.assert_array_equal(copied_ridge.coef_, ridge.coef_)
        np.testing.assert_allclose(
            copy.scorer.regressor.predict(rows), (ridge.predict(rows) + network.predict(rows)) / 2, rtol=1e-12
        )
        assert copy.manifest.thresholds == {} and copy.manifest.default_target is None
        assert not (out / f"layers-2-epochs-{epochs}-lr-0.001-batch-64" / "report").exists()
    args = [str(tiny_runs["train"]), "--artifact", str(averaged_artifact), "--write", str(out), "--epochs", "3"]
    main([*args, "--learning-rate", "0.002"])
    assert "layers-2-epochs-3-lr-0.002-batch-64 (its MLP is the artifact's own: False)" in capsys.readouterr().out
    slower = load_artifact(out / "layers-2-epochs-3-lr-0.002-batch-64")
    assert slower.manifest.regressor.params["learning_rate"] == 2e-3
    assert slower.scorer.regressor.members[1].learning_rate_init == 2e-3  # type: ignore[attr-defined]


def test_write_refuses_a_refit_of_the_artifacts_own_point_that_is_not_its_mlp(
    averaged_artifact: Path, tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refit = mlp_epochs.final_snapshots

    def nudged(*args: Any, **kwargs: Any) -> dict[int, MLPRegressor]:
        networks = refit(*args, **kwargs)
        for network in networks.values():
            weights = network.coefs_[0]  # float32, as the stage-2 matrix: one step of its spacing
            weights[0, 0] = np.nextafter(weights[0, 0], np.inf, dtype=weights.dtype)
        return networks

    monkeypatch.setattr(mlp_epochs, "final_snapshots", nudged)
    with pytest.raises(SystemExit, match="not the artifact's own"):
        main([str(tiny_runs["train"]), "--artifact", str(averaged_artifact), "--write", str(tmp_path), "--epochs", "3"])
