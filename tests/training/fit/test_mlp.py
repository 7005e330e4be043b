"""The stage-2 MLP option, its average with the ridge, and which stage 2 is installed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.uncertainty.aggregation import Aggregation
from training.fit.options import FitOptions
from training.fit.pipeline import run_fit
from training.fit.report import read_cv_record


def test_mlp_option(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    grid = {"layers": (2,), "epochs": (3,), "learning_rate": (1e-3,), "batch_size": (64,)}
    manifest = run_fit(
        FitOptions(runs=[tiny_runs["train"]], out=tmp_path / "a", alphas=(1.0,), mlp=True, mlp_width=16, mlp_grid=grid)
    )
    mlp = read_cv_record(tmp_path / "a", manifest)["mlp"]
    assert mlp["width"] == 16 and len(mlp["grid"]) == len(Aggregation)  # one configuration x every aggregation
    assert all(len(row["prr_folds"]) == 5 for row in mlp["grid"])
    assert manifest.regressor.kind in ("ridge", "mlp")


def test_mlp_average_option(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    import joblib

    from app.uncertainty.artifact import load_artifact
    from app.uncertainty.tad import AveragedRegressor, MLPStage2

    grid = {"layers": (2,), "epochs": (3,), "learning_rate": (1e-3,), "batch_size": (64,)}
    options = FitOptions(
        runs=[tiny_runs["train"]], out=tmp_path / "a", alphas=(1.0,), mlp=True, mlp_width=16, mlp_grid=grid
    )
    manifest = run_fit(replace(options, mlp_average=True))
    mlp = read_cv_record(tmp_path / "a", manifest)["mlp"]
    assert {row["stage2"] for row in mlp["grid"]} == {"mlp", "mlp+ridge"}
    average = mlp["average"]
    assert average["best"]["stage2"] == "mlp+ridge" and isinstance(average["kept"], bool)
    # The MLP's rows are the same folds' numbers as without the average (same seed, same matrix).
    alone = run_fit(replace(options, out=tmp_path / "b"))
    run_fit(replace(options, out=tmp_path / "ridge", mlp=False))
    assert [r["prr_folds"] for r in read_cv_record(tmp_path / "b", alone)["mlp"]["grid"]] == [
        r["prr_folds"] for r in mlp["grid"] if r["stage2"] == "mlp"
    ]
    assert manifest.regressor.kind == ("mlp+ridge" if average["kept"] else alone.regressor.kind)
    assert average["installed_by_force"] is False
    # --force-average installs it whatever the rule says, and records that it did.
    forced = run_fit(replace(options, out=tmp_path / "c", mlp_average=True, mlp_average_force=True))
    assert forced.regressor.kind == "mlp+ridge" and forced.regressor.params["alpha"] == 1.0
    assert read_cv_record(tmp_path / "c", forced)["mlp"]["average"]["installed_by_force"] is (not average["kept"])
    artifact = load_artifact(tmp_path / "c")
    assert isinstance(artifact.tad.regressor, AveragedRegressor)
    ridge, mlp = artifact.tad.regressor.members
    assert isinstance(artifact.tad.split, MLPStage2) and artifact.tad.split.with_linear
    # Its members are the ridge artifact's stage 2 and the MLP artifact's, fitted on the same rows.
    np.testing.assert_array_equal(ridge.coef_, joblib.load(tmp_path / "ridge" / "regressor.joblib").coef_)


class Interrupted(Exception):
    """Stands for the fit being stopped (Ctrl-C, a lost machine) partway through its MLP folds."""


def test_an_interrupted_mlp_cross_validation_resumes_from_its_finished_folds(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MLP folds are most of a fit: a rerun reads the finished ones back and fits only the rest, with the
    same record as a fit never stopped; a fit of other options reads none of them; a finished fit leaves none."""
    import training.fit.mlp as mlp_module
    from training.fit.fold_progress import progress_root

    grid = {"layers": (2,), "epochs": (3,), "learning_rate": (1e-3,), "batch_size": (64,)}
    options = FitOptions(
        runs=[tiny_runs["train"]], out=tmp_path / "whole", alphas=(1.0,), mlp=True, mlp_width=16, mlp_grid=grid
    )
    whole = read_cv_record(tmp_path / "whole", run_fit(options))["mlp"]["grid"]
    # A finished fit keeps no folds (other tests' stopped fits may have left theirs in the shared runs).
    assert not list(progress_root(options).glob("*/fold-*.json"))
    fitted: list[int] = []
    fold_scores = mlp_module._fold_scores

    def recorded(*args: Any, stop_at: int | None = None) -> Any:
        if args[-1] == stop_at:
            raise Interrupted
        fitted.append(args[-1])
        return fold_scores(*args)

    monkeypatch.setattr(mlp_module, "_fold_scores", lambda *args: recorded(*args, stop_at=3))
    with pytest.raises(Interrupted):
        run_fit(replace(options, out=tmp_path / "resumed"))
    assert fitted == [0, 1, 2]
    monkeypatch.setattr(mlp_module, "_fold_scores", recorded)
    fitted.clear()
    other = replace(options, out=tmp_path / "other", mlp_grid={**grid, "epochs": (4,)})
    run_fit(other)
    assert fitted == [0, 1, 2, 3, 4]  # another grid: none of the stopped fit's folds are its own
    assert list(progress_root(options).glob("*/fold-*.json"))  # and the stopped fit's are still there
    fitted.clear()
    resumed = run_fit(replace(options, out=tmp_path / "resumed"))
    assert fitted == [3, 4]
    # As text: an undefined PRR (NaN) is equal to itself there.
    assert json.dumps(read_cv_record(tmp_path / "resumed", resumed)["mlp"]["grid"]) == json.dumps(whole)
    assert not list(progress_root(options).glob("*/fold-*.json"))


CRAFTED_CONFIG = {"layers": 2, "epochs": 3, "learning_rate": 1e-3, "batch_size": 64}

NOISE = np.array([0.0, 0.1, -0.1, 0.1, -0.1])  # a fold-by-fold spread no mean gain of 0 survives


def _cv_row(stage2: str, folds: np.ndarray) -> dict[str, Any]:
    """A crafted MLP-search row whose folds are the same under both selection metrics."""
    values = [float(v) for v in folds]
    return {
        "stage2": stage2,
        **CRAFTED_CONFIG,
        "aggregation": "mean",
        "prr_mean": float(np.mean(values)),
        "prr_folds": values,
        "pooled_prr_folds": values,
        "within_group_prr_folds": values,
    }


def _plus(row: dict[str, Any], gain: float) -> np.ndarray:
    """The row's folds raised by `gain`, or (a gain of 0) spread by noise no trial rule keeps."""
    return np.array(row["prr_folds"]) + gain + (NOISE if gain == 0 else 0)


def _crafted_mlp_and_average(mlp_gain: float, average_gain: float) -> tuple[dict[str, Any], dict[str, Any]]:
    mlp = _cv_row("mlp", 5.0 * mlp_gain + np.array([0.0, 0.05, -0.05, 0.0, 0.0]))
    return mlp, _cv_row("mlp+ridge", _plus(mlp, average_gain))


def _crafted_options(tiny_runs: dict[str, Path], tmp_path: Path, force: bool) -> FitOptions:
    """Fit options for a crafted `mlp_search` (its grid is never run)."""
    return FitOptions(
        runs=[tiny_runs["train"]],
        out=tmp_path / "a",
        alphas=(1.0,),
        mlp=True,
        mlp_width=8,
        mlp_grid={},
        mlp_average=True,
        mlp_average_force=force,
    )


@pytest.mark.parametrize(
    ("mlp_gain", "average_gain", "force", "kind", "against", "forced"),
    [
        (1.0, 1.0, False, "mlp+ridge", "mlp", False),  # MLP kept, the average beats it significantly
        (1.0, 0.0, False, "mlp", "mlp", False),  # ... not significantly: the MLP stays
        (1.0, 0.0, True, "mlp+ridge", "mlp", True),  # ... unless forced, which is recorded
        # MLP not kept: the average against the ridge, whose folds on the tiny runs are mostly undefined
        # (no gain over them is significant), so only forcing installs it.
        (-1.0, 10.0, True, "mlp+ridge", "ridge", True),
        (-1.0, -10.0, False, "ridge", "ridge", False),
    ],
)
def test_which_stage_2_is_installed(
    tiny_runs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mlp_gain: float,
    average_gain: float,
    force: bool,
    kind: str,
    against: str,
    forced: bool,
) -> None:
    import training.fit.mlp as mlp_module

    def crafted_search(texts: Any, spec: Any, data: Any, choice: Any, options: Any) -> Any:
        mlp, average = _crafted_mlp_and_average(mlp_gain, average_gain)
        return mlp, average, [mlp, average]

    monkeypatch.setattr(mlp_module, "mlp_search", crafted_search)
    manifest = run_fit(_crafted_options(tiny_runs, tmp_path, force))
    assert manifest.regressor.kind == kind
    record = read_cv_record(tmp_path / "a", manifest)
    average = record["mlp"]["average"]
    # The manifest's summary names the stage 2 served and its row's CV PRR.
    served = {"ridge": record["chosen"], "mlp": record["mlp"]["best"], "mlp+ridge": average["best"]}[kind]
    assert manifest.metrics["cv"]["served"]["stage2"] == kind
    assert manifest.metrics["cv"]["served"]["prr_mean"] == pytest.approx(served["prr_mean"], nan_ok=True)
    assert average["against"] == against and average["installed_by_force"] is forced
    assert ("alpha" in manifest.regressor.params) is (kind != "mlp")
    assert ("layers" in manifest.regressor.params) is (kind != "ridge")
