"""The CV record goes to the artifact's report/cv.json; the manifest the server parses keeps a summary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.uncertainty.artifact import load_artifact, read_manifest, write_manifest
from tests.training.fit import QUICK_FIT
from training.fit.options import FitOptions
from training.fit.pipeline import run_fit
from training.fit.report import CV_REPORT, read_cv_record

SUMMARY = {"report", "folds", "split", "seed", "selection_metric", "chosen", "best_per_variant", "served"}


def _same(a: object, b: object) -> bool:
    """Equal as JSON (the tiny model leaves some PRRs NaN, which is never equal to itself)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.fixture(scope="module")
def fitted(tiny_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fit") / "artifact"
    run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, **QUICK_FIT))
    return out


def test_fit_writes_the_record_to_the_report_and_a_summary_to_the_manifest(fitted: Path) -> None:
    manifest = load_artifact(fitted).manifest
    record = json.loads((fitted / CV_REPORT).read_text())
    assert {"grid", "baselines", "conventions", "centrings", "weightings", "mlp"} <= set(record)
    summary = manifest.metrics["cv"]
    assert set(summary) == SUMMARY and summary["report"] == "report/cv.json"
    assert _same(summary["chosen"], record["chosen"]) and _same(summary["best_per_variant"], record["best_per_variant"])
    assert (summary["folds"], summary["split"], summary["seed"]) == (5, "by record", 0)
    assert summary["served"]["stage2"] == manifest.regressor.kind == "ridge"
    assert summary["served"]["aggregation"] == manifest.aggregation.value == record["chosen"]["aggregation"]
    assert _same(summary["served"]["prr_mean"], record["chosen"]["prr_mean"])
    assert _same(read_cv_record(fitted, manifest), record)
    # The record is most of what a fit writes; the manifest is the small part.
    assert (fitted / "manifest.json").stat().st_size < (fitted / CV_REPORT).stat().st_size
    assert "report/cv.json" not in manifest.files  # reports can be regenerated without invalidating the artifact


def _as_fitted_before_the_report(fitted: Path, out: Path) -> dict[str, object]:
    """A copy of the artifact as fits wrote it before report/cv.json: the whole record in the manifest."""
    shutil.copytree(fitted, out)
    record = json.loads((out / CV_REPORT).read_text())
    (out / CV_REPORT).unlink()
    manifest = read_manifest(out)
    write_manifest(out, manifest.model_copy(update={"metrics": {**manifest.metrics, "cv": record}}))
    return record


def test_an_artifact_fitted_before_the_report_is_read_from_its_manifest(fitted: Path, tmp_path: Path) -> None:
    record = _as_fitted_before_the_report(fitted, tmp_path / "old")
    assert _same(read_cv_record(tmp_path / "old", read_manifest(tmp_path / "old")), record)


def test_a_corrupt_record_is_named(fitted: Path, tmp_path: Path) -> None:
    artifact = Path(shutil.copytree(fitted, tmp_path / "artifact"))
    (artifact / CV_REPORT).write_text("{")
    with pytest.raises(SystemExit, match=r"report/cv\.json is corrupt"):
        read_cv_record(artifact, read_manifest(artifact))
