"""Runs for evaluate/calibrate: several runs read together (a run and its --skip extension), checked against
the artifact (its model, its lags, and answers held out from its fit)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from app.uncertainty.artifact import load_artifact
from training.run_source import RunSource, obtain_runs
from training.runs import completed_shards, iter_texts


def test_several_runs_are_read_together(tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path) -> None:
    from training.evaluation import run_evaluate

    runs = [tiny_runs["dev"], other_records(tiny_runs["dev"], tmp_path / "extension")]
    source = RunSource(data=[], runs=runs, default_run_dir=tmp_path / "unused")
    assert obtain_runs(source, load_artifact(tiny_artifact)) == runs
    report = run_evaluate(tiny_artifact, source, tmp_path / "report", resamples=0)
    assert report["overall"]["n"] == len(list(iter_texts(runs)))
    assert report["runs"] == [str(run) for run in runs]


def test_a_run_of_another_model_is_refused(tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    shutil.copytree(tiny_runs["dev"], foreign)
    settings = json.loads((foreign / "run.json").read_text())
    (foreign / "run.json").write_text(json.dumps({**settings, "model_sha256": "0" * 64}))
    source = RunSource(data=[], runs=[tiny_runs["dev"], foreign], default_run_dir=tmp_path / "unused")
    with pytest.raises(SystemExit, match="another model"):
        obtain_runs(source, load_artifact(tiny_artifact))


def other_records(run: Path, copy: Path) -> Path:
    """A copy of `run` whose answers are to other records (their keys changed), as a --skip extension's are."""
    shutil.copytree(run, copy)
    for shard in completed_shards(copy):
        metas = json.loads((shard / "texts.json").read_text())
        (shard / "texts.json").write_text(json.dumps([{**m, "key": f"{m['key']}-more"} for m in metas]))
    return copy


@pytest.mark.parametrize("command", ["evaluate", "calibrate"])
def test_answers_to_records_the_artifact_was_fitted_on_are_refused(
    command: str, tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    """In-sample, TAD looks better than it is, and a certified threshold would promise an error rate the service
    does not have: refused before anything is scored or replaced, whichever prompt style the answers are in."""
    from training.calibration import CalibrationTargets, run_calibrate
    from training.evaluation import run_evaluate

    artifact = Path(shutil.copytree(tiny_artifact, tmp_path / "artifact"))
    manifest = (artifact / "manifest.json").read_text()
    source = RunSource(data=[], runs=[tiny_runs["dev"], tiny_runs["train"]], default_run_dir=tmp_path / "unused")
    with pytest.raises(SystemExit, match=r"records to (evaluate|calibrate) on .* are among those the artifact was fit"):
        if command == "evaluate":
            run_evaluate(artifact, source, tmp_path / "report", resamples=0)
        else:
            run_calibrate(artifact, source, CalibrationTargets(coverages=[0.5], errors=[], delta=0.1))
    assert (artifact / "manifest.json").read_text() == manifest and not (tmp_path / "report").exists()


def test_an_artifact_whose_training_runs_are_elsewhere_is_not_refused_but_said(
    tiny_runs: dict[str, Path], tiny_artifact: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from training.run_source import check_held_out

    artifact = load_artifact(tiny_artifact)
    moved = artifact.manifest.model_copy(update={"training": {**artifact.manifest.training, "runs": ["/nowhere/run"]}})
    elsewhere = replace(artifact, manifest=moved)
    check_held_out(elsewhere, ["mmlu/mmlu-train-0"], "evaluate on")
    assert "not checked" in caplog.text


def altered_run(run: Path, folder: Path, **settings: object) -> Path:
    """A copy of `run` whose run.json says it was made with other `settings` (e.g. model_sha256, n_lags)."""
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


def test_a_run_generated_in_another_dtype_than_the_artifacts_answers_is_refused(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    """The server runs the model in the artifact's dtype: answers in another have other features and scores,
    and thresholds calibrated on them would not hold for what it serves."""
    from training.run_source import check_runs_match

    artifact = load_artifact(tiny_artifact)
    assert artifact.manifest.dtype == "float32"
    check_runs_match([tiny_runs["dev"]], artifact)
    other = altered_run(tiny_runs["dev"], tmp_path, dtype="bfloat16")
    with pytest.raises(SystemExit, match="generated in bfloat16, the artifact's answers in float32"):
        check_runs_match([other], artifact)


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


@pytest.mark.parametrize("style", ["task", "chat"])
def test_answers_generated_here_are_asked_in_the_style_given(
    style: str, tiny_artifact: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]], tmp_path: Path
) -> None:
    """calibrate --data --prompt-style chat certifies thresholds on questions asked as users ask them."""
    from training.cli import main

    artifact = Path(shutil.copytree(tiny_artifact, tmp_path / "artifact"))
    data = ["--data", str(tiny_data["dev"][0]), "--model", str(tiny_model_dir), "--limit", "4", "--max-new-tokens", "2"]
    main(["calibrate", "--artifact", str(artifact), *data, "--coverage", "0.5", "--prompt-style", style])
    run = artifact / "calibration-run"
    assert json.loads((run / "run.json").read_text())["prompt_style"] == style
    assert {text.prompt_style.value for text in iter_texts([run])} == {style}
