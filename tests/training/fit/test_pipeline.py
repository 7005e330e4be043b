"""run_fit as a whole: what it refuses before the minutes of cross-validation, and what it reads."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.training.fit import QUICK_FIT
from training.fit.options import FitOptions
from training.fit.pipeline import run_fit


def test_an_out_that_cannot_be_the_artifact_is_refused_before_the_runs_are_read(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import training.fit.pipeline as pipeline

    def never(*args: object) -> None:
        raise AssertionError("the runs were read")

    monkeypatch.setattr(pipeline, "load_runs", never)
    a_file = tmp_path / "artifact"
    a_file.write_text("")
    with pytest.raises(SystemExit, match="is a file"):
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=a_file, **QUICK_FIT))
    with pytest.raises(SystemExit, match="is a generation run"):
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=tiny_runs["dev"], **QUICK_FIT))
    with pytest.raises(SystemExit, match="holds the run"):
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=tiny_runs["train"].parent, **QUICK_FIT))
    other_files = tmp_path / "experiments"
    other_files.mkdir()
    (other_files / "notes.joblib").write_text("")
    with pytest.raises(SystemExit, match="other files in it and no artifact"):
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=other_files, **QUICK_FIT))


def test_only_an_artifact_of_the_runs_model_is_refitted_in_place(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import training.fit.pipeline as pipeline

    def read(*args: object) -> None:
        raise AssertionError("the runs were read")

    monkeypatch.setattr(pipeline, "load_runs", read)
    same = Path(shutil.copytree(tiny_artifact, tmp_path / "same"))
    with pytest.raises(AssertionError, match="the runs were read"):  # accepted: the fit goes on
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=same, **QUICK_FIT))
    other = Path(shutil.copytree(tiny_artifact, tmp_path / "other"))
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["llm"] = {**manifest["llm"], "name": "another-model", "sha256": "0" * 64}
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match=r"the artifact of another model \(another-model\)"):
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=other, **QUICK_FIT))


def test_a_run_given_twice_is_refused(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="more than once"):
        run_fit(FitOptions(runs=[tiny_runs["train"], tiny_runs["train"]], out=tmp_path / "a", **QUICK_FIT))


def test_a_run_made_with_the_attention_to_the_prompt_is_fitted_as_before(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    """Runs that `generate --prompt-attention` made (removed since) hold hundreds more statistics and say so in
    their settings: they are still read, and fit as the same answers without them."""
    import json

    import joblib

    from training.runs import RUN_FILE, read_run_settings

    annotated = tmp_path / "annotated-run"
    shutil.copytree(tiny_runs["train"], annotated)
    for entropy in annotated.glob("shards/*/stat-entropy.npy"):
        for name in ("prompt_mass_l00_h0", "prompt_sink_l00_h0"):
            shutil.copy(entropy, entropy.with_name(f"stat-{name}.npy"))
    settings = read_run_settings(annotated)
    (annotated / RUN_FILE).write_text(json.dumps({**settings, "prompt_attention": True}))
    plain = run_fit(FitOptions(runs=[tiny_runs["train"]], out=tmp_path / "plain", **QUICK_FIT))
    fitted = run_fit(FitOptions(runs=[annotated], out=tmp_path / "annotated", **QUICK_FIT))
    assert fitted.features == plain.features
    # The same cross-validation (NaN where the tiny model leaves a fold's PRR undefined: compared as text).
    assert json.dumps(fitted.metrics["cv"]["chosen"]) == json.dumps(plain.metrics["cv"]["chosen"])
    np.testing.assert_array_equal(
        joblib.load(tmp_path / "annotated" / "regressor.joblib").coef_,
        joblib.load(tmp_path / "plain" / "regressor.joblib").coef_,
    )


def test_fewer_records_than_folds_is_said_plainly(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="cannot be split into 100 folds"):
        run_fit(FitOptions(runs=[tiny_runs["train"]], out=tmp_path / "a", folds=100, **QUICK_FIT))


def test_the_artifact_records_its_decision_method_and_the_dtype_of_its_answers(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    import json

    manifest = run_fit(FitOptions(runs=[tiny_runs["train"]], out=tmp_path / "artifact", **QUICK_FIT))
    record = json.loads((tmp_path / "artifact" / "report" / "cv.json").read_text())
    decision = record["decision"]
    # TAD as served against every free score on the same folds; the manifest writes the rule's choice.
    assert decision["reference"] == "tad" and set(decision["means"]) >= {"tad", "msp", "rauq"}
    assert len(record["chosen"]["prr_folds"]) == len(record["baselines"]["msp"]["prr_folds"])
    assert manifest.decision_method is not None and manifest.decision_method.value == decision["chosen"]
    adopted = decision["interval"] is not None and decision["interval"][0] > 0
    assert decision["chosen"] == (decision["challenger"] if adopted else "tad")
    assert manifest.dtype == "float32"  # the tiny runs were generated in float32


def test_answers_all_alike_are_refused_not_fitted_to_a_nan(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    import json

    run = Path(shutil.copytree(tiny_runs["train"], tmp_path / "all-wrong"))
    for texts in run.glob("shards/*/texts.json"):
        metas = json.loads(texts.read_text())
        texts.write_text(json.dumps([{**meta, "target": 0.0} for meta in metas]))
    with pytest.raises(SystemExit, match=r"answers have the same quality \(0\): fit needs right and wrong"):
        run_fit(FitOptions(runs=[run], out=tmp_path / "a", **QUICK_FIT))
    assert not (tmp_path / "a").exists()


class Interrupted(Exception):
    """Stands for the fit being stopped (Ctrl-C, a lost machine) between two trials' cross-validations."""


def test_an_interrupted_fit_resumes_from_its_finished_trials(
    tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each trial (a convention, centring and weighting) is a whole cross-validation, most of a ridge fit: a rerun
    reads the finished ones back, with the record of a fit never stopped, and a finished fit keeps none."""
    import json

    import training.fit.cross_validation as cv
    from app.uncertainty.features import Convention
    from training.fit.pipeline import trial_progress
    from training.fit.report import read_cv_record
    from training.fit.texts import load_runs
    from training.groups import TargetCentring
    from training.weighting import RowWeighting

    runs = Path(shutil.copytree(tiny_runs["train"], tmp_path / "runs"))  # no other test's stopped fits in it
    options = FitOptions(
        runs=[runs],
        out=tmp_path / "whole",
        **{**QUICK_FIT, "centrings": (TargetCentring.NONE, TargetCentring.GROUP)},
        conventions=(Convention.GENERATING,),
        weightings=(RowWeighting.TOKEN,),  # two trials: the centrings
    )
    whole = read_cv_record(options.out, run_fit(options))
    texts, _, lags = load_runs(options.runs, options.n_lags)
    store = trial_progress(options, texts, lags).folder
    assert not store.exists()
    assert trial_progress(options, texts, lags - 1).folder != store  # features of other lags: other trials
    calls: list[int] = []
    cross_validate = cv.cross_validate

    def counted(*args: object, stop_at: int | None = None) -> object:
        calls.append(1)
        if len(calls) == stop_at:
            raise Interrupted
        return cross_validate(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(cv, "cross_validate", lambda *args: counted(*args, stop_at=2))
    with pytest.raises(Interrupted):
        run_fit(replace(options, out=tmp_path / "resumed"))
    assert [item.name for item in store.iterdir()] == ["cv-generating-none-token.json"]
    monkeypatch.setattr(cv, "cross_validate", counted)
    calls.clear()
    resumed = read_cv_record(tmp_path / "resumed", run_fit(replace(options, out=tmp_path / "resumed")))
    assert len(calls) == 1  # the second trial alone
    assert json.dumps(resumed) == json.dumps(whole)
    assert not store.exists()
