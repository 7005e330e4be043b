"""Runs for evaluate/calibrate: several runs read together (a run and its --skip extension)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.uncertainty.artifact import load_artifact
from training.run_source import RunSource, obtain_runs
from training.runs import iter_texts


def test_several_runs_are_read_together(tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path) -> None:
    from training.evaluation import run_evaluate

    runs = [tiny_runs["dev"], tiny_runs["train"]]
    source = RunSource(data=[], runs=runs, default_run_dir=tmp_path / "unused")
    assert obtain_runs(source, load_artifact(tiny_artifact)) == runs
    report = run_evaluate(tiny_artifact, source, tmp_path / "report", resamples=0)
    assert report["overall"]["n"] == len(list(iter_texts(runs)))
    assert report["runs"] == [str(run) for run in runs]


def test_a_run_of_another_model_is_refused(tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path) -> None:
    import json
    import shutil

    foreign = tmp_path / "foreign"
    shutil.copytree(tiny_runs["dev"], foreign)
    settings = json.loads((foreign / "run.json").read_text())
    (foreign / "run.json").write_text(json.dumps({**settings, "model_sha256": "0" * 64}))
    source = RunSource(data=[], runs=[tiny_runs["dev"], foreign], default_run_dir=tmp_path / "unused")
    with pytest.raises(SystemExit, match="another model"):
        obtain_runs(source, load_artifact(tiny_artifact))


def altered_run(run: Path, folder: Path, **settings: object) -> Path:
    """A copy of `run` whose run.json says it was made with other `settings` (e.g. model_sha256, n_lags)."""
    import json
    import shutil

    copy = folder / f"altered-{'-'.join(settings)}"
    shutil.copytree(run, copy)
    stored = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps({**stored, **settings}))
    return copy


def test_a_run_with_fewer_lags_than_the_artifact_needs_is_refused(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    from training.run_source import check_runs_match

    short = altered_run(tiny_runs["dev"], tmp_path, n_lags=1)
    with pytest.raises(SystemExit, match="stores 1 lags"):
        check_runs_match([short], load_artifact(tiny_artifact))


@pytest.mark.parametrize("kind", ["missing", "file", "not a run"])
def test_a_path_that_is_not_a_run_is_refused(
    kind: str, tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    path = tmp_path / "x"
    if kind == "file":
        path.write_text("")
    elif kind == "not a run":
        path.mkdir()
    source = RunSource(data=[], runs=[path], default_run_dir=tmp_path / "unused")
    with pytest.raises(SystemExit, match=r"does not exist|not a folder|not a generation run"):
        obtain_runs(source, load_artifact(tiny_artifact))


def test_generating_with_another_model_than_the_artifacts_is_refused_before_any_answer(
    tiny_artifact: Path, tiny_data: dict[str, list[Path]], tmp_path: Path
) -> None:
    # calibrate --data would otherwise rewrite the artifact's thresholds from another model's answers.
    from tests.fixtures.tiny_model import write_tiny_model

    other = write_tiny_model(tmp_path / "other-model", seed=1)
    source = RunSource(data=tiny_data["dev"][:1], runs=[], default_run_dir=tmp_path / "run", model=str(other))
    with pytest.raises(SystemExit, match="not the model the artifact was trained for"):
        obtain_runs(source, load_artifact(tiny_artifact))
    assert not list((tmp_path / "run").glob("shards/*"))
