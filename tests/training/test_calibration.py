"""`calibrate` refuses what would write meaningless thresholds over the artifact's calibration."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.training.test_run_source import altered_run
from training.calibration import run_calibrate
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
        run_calibrate(artifact, source, coverages=[0.5], errors=[0.3], delta=0.1)
    assert (artifact / "manifest.json").read_text() == before


def test_no_targets_at_all_are_refused(tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path) -> None:
    artifact = tmp_path / "artifact"
    shutil.copytree(tiny_artifact, artifact)
    before = (artifact / "manifest.json").read_text()
    source = RunSource(data=[], runs=[tiny_runs["dev"]], default_run_dir=tmp_path / "unused")
    with pytest.raises(SystemExit, match="at least one"):
        run_calibrate(artifact, source, coverages=[], errors=[], delta=0.1)
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
