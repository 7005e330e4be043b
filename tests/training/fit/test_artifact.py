"""The artifact folder: written aside and swapped in, so that a fit killed at any moment leaves a loadable one."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.training.fit import QUICK_FIT
from training.fit.artifact import check_out, install_artifact
from training.fit.options import FitOptions
from training.fit.pipeline import run_fit
from training.groups import TargetCentring
from training.two_stage import Variant


def test_a_refit_into_the_same_folder_keeps_only_its_own_alternatives(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "a"
    from training.weighting import RowWeighting

    quick = {
        "alphas": (1.0,),
        "centrings": (TargetCentring.NONE,),
        "weightings": (RowWeighting.TOKEN,),
    }
    run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, **quick))
    assert len(list((out / "alternatives").iterdir())) == 2
    manifest = run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, variants=(Variant.LEAK_FREE,), **quick))
    assert not (out / "alternatives").exists() or not any((out / "alternatives").iterdir())
    assert set(manifest.files) == {"regressor.joblib", "stage1.joblib"}


def test_a_fit_killed_while_writing_leaves_the_previous_artifact_and_the_next_replaces_it(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.uncertainty.artifact as artifact_module
    from app.uncertainty.artifact import load_artifact

    out = tmp_path / "artifact"
    run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, **QUICK_FIT))
    real_dumps = artifact_module.json.dumps

    def half_then_killed(*args: Any, **kwargs: Any) -> str:
        # The manifest's text is cut off, as a write killed midway leaves it.
        class Killed(str):
            def __add__(self, other: str) -> str:
                raise KeyboardInterrupt

        return Killed(real_dumps(*args, **kwargs)[:100])

    monkeypatch.setattr(artifact_module.json, "dumps", half_then_killed)
    with pytest.raises(KeyboardInterrupt):
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, **{**QUICK_FIT, "alphas": (0.01,)}))
    monkeypatch.undo()
    assert load_artifact(out).manifest.regressor.params["alpha"] == 1.0
    # The next refit in place (as scripts/train_smollm2.sh does) replaces it and keeps what lies beside it,
    # but not the old regressor's reports: beside the new cv.json they would pass for the new one's.
    (out / "report" / "chat").mkdir(parents=True)  # the fit wrote its cv.json in report/
    (out / "report" / "chat" / "report.md").write_text("the old regressor's evaluation")
    (out / "README.md").write_text("kept")
    manifest = run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, **{**QUICK_FIT, "alphas": (0.01,)}))
    assert manifest.regressor.params["alpha"] == 0.01
    assert load_artifact(out).manifest.regressor.params["alpha"] == 0.01
    assert (out / "README.md").read_text() == "kept"
    assert sorted(p.name for p in (out / "report").iterdir()) == ["cv.json"]
    assert json.loads((out / "report" / "cv.json").read_text())["chosen"]["alpha"] == 0.01
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]  # no staging folder left behind


def test_a_manifest_write_killed_midway_leaves_the_previous_manifest(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.uncertainty.artifact import load_artifact, write_manifest

    out = tmp_path / "artifact"
    manifest = run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, **QUICK_FIT))

    def killed_midway(descriptor: int) -> None:  # the new text written, not yet on disk nor renamed into place
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        write_manifest(out, manifest.model_copy(update={"default_target": "coverage@0.5"}))
    monkeypatch.undo()
    assert load_artifact(out).manifest.default_target == manifest.default_target


def _artifact_folder(path: Path, regressor: str, extra: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    (path / "manifest.json").write_text("{}")
    (path / "regressor.joblib").write_text(regressor)
    for name, text in extra.items():
        (path / name).write_text(text)
    return path


def test_a_fit_killed_between_its_renames_is_repaired_by_the_next(tmp_path: Path) -> None:
    out = tmp_path / "artifact"
    # Killed after moving the old artifact aside and before moving the new one in: `out` is missing.
    _artifact_folder(tmp_path / ".artifact.replaced-123", "old", {"report.md": "old report"})
    install_artifact(_artifact_folder(tmp_path / "staging", "new", {}), out)
    assert (out / "regressor.joblib").read_text() == "new" and (out / "report.md").read_text() == "old report"
    assert not list(tmp_path.glob(".artifact.replaced-*"))


def test_an_artifact_a_killed_fit_left_aside_is_checked_before_the_next_fit_replaces_it(
    tmp_path: Path, tiny_artifact: Path, tiny_runs: dict[str, Path]
) -> None:
    """With `--out` missing after the kill, the next fit must not take it for a new folder: the old artifact
    is put back first, so that refitting another model's artifact is refused before any work, as always."""
    aside = tmp_path / ".artifact.replaced-123"
    shutil.copytree(tiny_artifact, aside)
    manifest = json.loads((aside / "manifest.json").read_text())
    manifest["llm"]["sha256"] = "0" * 64  # another model's artifact
    (aside / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "artifact"
    with pytest.raises(SystemExit, match="is the artifact of another model"):
        check_out(out, [tiny_runs["train"]])
    assert (out / "manifest.json").is_file() and not aside.exists()


def test_a_fit_killed_while_carrying_over_is_finished_by_the_next(tmp_path: Path) -> None:
    out = _artifact_folder(tmp_path / "artifact", "newer", {})
    _artifact_folder(tmp_path / ".artifact.replaced-123", "old", {"calibration-run": "answers"})
    install_artifact(_artifact_folder(tmp_path / "staging", "newest", {}), out)
    assert (out / "regressor.joblib").read_text() == "newest" and (out / "calibration-run").read_text() == "answers"
    assert not list(tmp_path.glob(".artifact.replaced-*"))


def test_a_refit_in_place_replaces_the_old_reports_and_keeps_what_else_lies_beside_them(tmp_path: Path) -> None:
    """The old report/ folder describes the old regressor: beside the new cv.json it would pass for the new
    one's, so it goes; what else lay beside the old artifact (its README, a calibration run) is kept."""
    out = _artifact_folder(tmp_path / "artifact", "old", {})
    (out / "report" / "chat").mkdir(parents=True)
    (out / "report" / "chat" / "report.md").write_text("old evaluation")
    (out / "report" / "cv.json").write_text("old record")
    (out / "calibration-run").mkdir()
    (out / "calibration-run" / "run.json").write_text("answers")
    (out / "README.md").write_text("about the artifact")
    # What was generated under report/ (answers: the model's, not the regressor's) and a stopped lodo's progress.
    (out / "report" / "dev" / "run").mkdir(parents=True)
    (out / "report" / "dev" / "run" / "run.json").write_text("answers")
    (out / "report" / "dev" / "report.md").write_text("old evaluation")
    (out / "report" / "lodo" / "lodo-progress" / "key").mkdir(parents=True)
    (out / "report" / "lodo" / "lodo-progress" / "key" / "squad.json").write_text("{}")
    (out / "report" / "lodo" / "lodo.md").write_text("old table")
    staging = _artifact_folder(tmp_path / "staging", "new", {})
    (staging / "report").mkdir()
    (staging / "report" / "cv.json").write_text("new record")
    install_artifact(staging, out)
    assert (out / "regressor.joblib").read_text() == "new"
    files = sorted(p.relative_to(out / "report").as_posix() for p in (out / "report").rglob("*") if p.is_file())
    assert files == ["cv.json", "dev/run/run.json", "lodo/lodo-progress/key/squad.json"]
    assert (out / "report" / "cv.json").read_text() == "new record"
    assert (out / "calibration-run" / "run.json").read_text() == "answers"
    assert (out / "README.md").read_text() == "about the artifact"
    assert not list(tmp_path.glob(".artifact.replaced-*"))
