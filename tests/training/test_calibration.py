"""`calibrate` refuses what would write meaningless thresholds over the artifact's calibration."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from app.uncertainty.artifact import Threshold
from app.uncertainty.methods import Method
from tests.training.test_run_source import altered_run
from training.calibration import (
    Calibration,
    CalibrationTargets,
    calibrate_thresholds,
    check_default,
    default_keeping,
    kept_share_lower_bound,
    run_calibrate,
)
from training.cli import main
from training.run_source import RunSource


def _empty_run(run: Path, folder: Path) -> Path:
    """A run folder as `generate` leaves it on an empty data file: settings, no shards."""
    empty = folder / "empty-run"
    empty.mkdir()
    shutil.copy(run / "run.json", empty / "run.json")
    return empty


def test_a_run_with_no_answers_is_refused_and_the_manifest_is_untouched(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    artifact = tmp_path / "artifact"
    shutil.copytree(tiny_artifact, artifact)
    before = (artifact / "manifest.json").read_text()
    source = RunSource(data=[], runs=[_empty_run(tiny_runs["dev"], tmp_path)], default_run_dir=tmp_path / "unused")
    with pytest.raises(SystemExit, match="hold no answers"):
        run_calibrate(artifact, source, CalibrationTargets(coverages=[0.5], errors=[0.3], delta=0.1))
    assert (artifact / "manifest.json").read_text() == before


def test_no_targets_at_all_are_refused(tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path) -> None:
    artifact = tmp_path / "artifact"
    shutil.copytree(tiny_artifact, artifact)
    before = (artifact / "manifest.json").read_text()
    source = RunSource(data=[], runs=[tiny_runs["dev"]], default_run_dir=tmp_path / "unused")
    with pytest.raises(SystemExit, match="at least one"):
        run_calibrate(artifact, source, CalibrationTargets(coverages=[], errors=[], delta=0.1))
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", "--artifact", str(artifact), "--run", str(tiny_runs["dev"]), "--coverage", "--error"])
    assert exit_info.value.code == 2
    assert (artifact / "manifest.json").read_text() == before


@pytest.mark.parametrize(
    ("option", "value"),
    [("--coverage", "0"), ("--coverage", "1.5"), ("--coverage", "nan"), ("--error", "0"), ("--error", "1")],
)
def test_targets_outside_their_range_are_refused_when_parsed(
    option: str, value: str, tiny_artifact: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", "--artifact", str(tiny_artifact), "--run", "unused", option, value])
    assert exit_info.value.code == 2
    assert f"argument {option}" in capsys.readouterr().err


def test_a_changed_calibration_run_names_the_run_dir_option(
    tiny_runs: dict[str, Path],
    tiny_artifact: Path,
    tiny_model_dir: Path,
    tiny_data: dict[str, list[Path]],
    tmp_path: Path,
) -> None:
    from tests.conftest import N_LAGS

    artifact = tmp_path / "artifact"
    shutil.copytree(tiny_artifact, artifact)
    # A run folder made with other settings (more lags) than calibrate would generate with now.
    taken = altered_run(tiny_runs["dev"], tmp_path, n_lags=N_LAGS + 1)
    data = [str(path) for path in tiny_data["dev"]]
    argv = ["calibrate", "--artifact", str(artifact), "--data", *data, "--model", str(tiny_model_dir)]
    with pytest.raises(SystemExit, match="use a new --run-dir folder"):
        main([*argv, "--run-dir", str(taken), "--limit", "1", "--max-new-tokens", "2"])


def _error_threshold(threshold: float, target: float) -> Threshold:
    return Threshold(threshold=threshold, kind="error", target=target, coverage=0.5, error=target, n=100)


def test_keep_half_takes_the_strictest_target_whose_kept_share_is_bounded_above_half() -> None:
    # 100 correct answers scored 0..99, 100 wrong ones scored 100..199: a threshold t accepts t+1 correct ones.
    values = np.arange(200, dtype=float)
    quality = np.array([1.0] * 100 + [0.0] * 100)
    decided = {
        "error@0.1": _error_threshold(54.0, 0.1),  # 55 kept: the point estimate passes, the lower bound does not
        "error@0.2": _error_threshold(64.0, 0.2),  # 65 kept: lower bound about 0.56
        "error@0.3": _error_threshold(90.0, 0.3),
    }
    assert kept_share_lower_bound(55, 100, 0.05) < 0.5 < kept_share_lower_bound(65, 100, 0.05)
    assert default_keeping(decided, values, quality, 0.5, delta=0.05) == "error@0.2"
    # With no target keeping enough, the loosest certified one.
    assert default_keeping({"error@0.1": decided["error@0.1"]}, values, quality, 0.5, delta=0.05) == "error@0.1"
    assert default_keeping({}, values, quality, 0.5, delta=0.05) is None


def test_a_record_answered_in_two_prompt_styles_is_said_to_make_the_guarantee_optimistic(
    tiny_runs: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    from dataclasses import replace

    from training.calibration import warn_on_twins
    from training.runs import iter_texts

    first, second = list(iter_texts([tiny_runs["dev"]]))[:2]
    warn_on_twins([first, second])
    assert "prompt style" not in caplog.text
    other_style = "task" if first.prompt_style.value == "chat" else "chat"
    twin = replace(second, meta={**first.meta, "prompt_style": other_style})
    warn_on_twins([first, twin])
    assert "1 of the 1 records are answered in more than one prompt style" in caplog.text


def _calibrated(values: np.ndarray, quality: np.ndarray, targets: CalibrationTargets) -> Calibration:
    return calibrate_thresholds({"tad": values}, quality, [Method.TAD], Method.TAD, targets)


def test_a_default_that_accepts_no_answer_is_refused_and_no_coverage_0_is_made_up() -> None:
    # One answer: keeping half of it keeps none, and every answer would be rejected.
    calibration = _calibrated(np.array([0.3]), np.array([1.0]), CalibrationTargets([0.5], [0.3], delta=0.1))
    assert "coverage@0" not in calibration.thresholds[Method.TAD]
    with pytest.raises(SystemExit, match="accepts none of the 1 calibration answers"):
        check_default(calibration, Method.TAD, [0.3])


def test_no_default_at_all_is_refused() -> None:
    rng = np.random.default_rng(0)
    # every answer wrong: no error target is certified, and no coverage target was asked for
    calibration = _calibrated(rng.random(200), np.zeros(200), CalibrationTargets([], [0.1], delta=0.1))
    assert calibration.default_target is None
    with pytest.raises(SystemExit, match="no target is calibrated for tad on these 200 answers"):
        check_default(calibration, Method.TAD, [0.1])


def test_a_coverage_default_in_place_of_an_uncertified_error_target_is_said(caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(0)
    calibration = _calibrated(rng.random(200), np.zeros(200), CalibrationTargets([0.9], [0.1], delta=0.1))
    check_default(calibration, Method.TAD, [0.1])
    assert "the default target is coverage@0.9, which bounds no error rate (1.000" in caplog.text
    caplog.clear()
    check_default(calibration, Method.TAD, [])  # only coverage was asked for: nothing to say
    assert "bounds no error rate" not in caplog.text
    # a coverage default named while an error target is certified: nothing stood in for anything
    values = np.arange(200) / 200
    quality = (values < 0.8).astype(float)
    named = CalibrationTargets([0.5], [0.3], delta=0.1, default_target="coverage@0.5")
    calibration = _calibrated(values, quality, named)
    assert "error@0.3" in calibration.thresholds[Method.TAD]
    check_default(calibration, Method.TAD, [0.3])
    assert "bounds no error rate" not in caplog.text


def test_the_calibration_runs_are_recorded_resolved(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    artifact = tmp_path / "artifact"
    shutil.copytree(tiny_artifact, artifact)
    monkeypatch.chdir(tiny_runs["dev"].parent)
    source = RunSource(data=[], runs=[Path(tiny_runs["dev"].name)], default_run_dir=tmp_path / "unused")
    manifest = run_calibrate(artifact, source, CalibrationTargets(coverages=[0.5], errors=[], delta=0.1))
    assert manifest.metrics["calibration"]["runs"] == [str(tiny_runs["dev"].resolve())]
