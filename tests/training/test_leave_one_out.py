"""Leave one dataset out on the tiny model's runs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.uncertainty.aggregation import Aggregation
from app.uncertainty.tad import AveragedRegressor
from tests.artifacts import as_mlp_artifact
from tests.conftest import N_LAGS
from tests.training.killed_writes import killed_writing
from training import leave_one_out as lodo
from training.cli import main
from training.fit.cross_validation import Choice, fit_final
from training.generation import GenerateOptions, run_generate
from training.groups import TargetCentring, centred


def _lodo(
    runs: dict[str, Path],
    artifact: Path,
    out: Path,
    *extra: str,
    more_train: Sequence[Path] = (),
    more_test: Sequence[Path] = (),
) -> dict[str, Any]:
    train = [str(path) for path in (runs["train"], *more_train)]
    tests = [str(path) for path in (runs["dev"], *more_test)]
    test = ["--test", *tests, "--artifact", str(artifact), "--out", str(out), "--bootstrap", "50"]
    main(["lodo", *train, *test, *extra])
    return json.loads((out / "lodo.json").read_text())


def test_every_dataset_is_held_out_once(tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path) -> None:
    report = _lodo(tiny_runs, tiny_artifact, tmp_path)
    assert set(report["datasets"]) == {"squad", "mmlu"}
    for entry in report["datasets"].values():
        assert entry["n"] == 16 and entry["train_texts"] == 24  # fitted on the other dataset only
        assert {"tad", "msp", "perplexity"} <= set(entry["prr"])
    assert (tmp_path / "lodo.md").read_text().startswith("Leave one dataset out")
    # The artifact's own fold unit (its stage-1 out-of-fold predictions depend on it).
    assert report["configuration"]["fold_unit"] == "record"
    # Which runs were fitted and scored, in the report and its text.
    assert report["runs"] == {"train": [str(tiny_runs["train"])], "test": [str(tiny_runs["dev"])]}
    assert (
        f"Trained on {tiny_runs['train']}; scored the held-out dataset's answers in {tiny_runs['dev']}."
        in (tmp_path / "lodo.md").read_text()
    )
    # The mean over informative held-out datasets comes with its bootstrap interval (None when none is informative).
    mean, ci = report["mean_tad_minus_msp_informative"], report["mean_tad_minus_msp_informative_ci95"]
    assert (mean is None) == (ci is None)
    if ci is not None:
        assert ci[0] <= ci[1]


def test_a_lodo_killed_as_it_writes_leaves_no_report_made_of_two(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import training.leave_one_out as leave_one_out

    _lodo(tiny_runs, tiny_artifact, tmp_path)
    monkeypatch.setattr(leave_one_out, "write_text_atomic", killed_writing("lodo.md", leave_one_out.write_text_atomic))
    with pytest.raises(SystemExit, match="130"):  # the CLI's answer to Ctrl-C
        _lodo(tiny_runs, tiny_artifact, tmp_path, "--bootstrap", "40")
    assert not (tmp_path / "lodo.json").exists()  # the earlier run's lodo.json is not left beside a new lodo.md


def test_the_fold_unit_and_seed_come_from_the_artifacts_cv_record(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training.fit.report import CV_REPORT

    artifact = Path(shutil.copytree(tiny_artifact, tmp_path / "artifact"))
    record = json.loads((artifact / CV_REPORT).read_text())
    (artifact / CV_REPORT).write_text(json.dumps({**record, "split": "by text", "seed": 7}))
    seeds: list[int] = []
    real_prepare_folds = lodo.prepare_folds

    def recording_prepare_folds(texts: Any, spec: Any, options: Any) -> Any:
        seeds.append(options.seed)
        return real_prepare_folds(texts, spec, options)

    monkeypatch.setattr(lodo, "prepare_folds", recording_prepare_folds)
    report = _lodo(tiny_runs, artifact, tmp_path / "lodo")
    assert report["configuration"]["fold_unit"] == "text" and seeds == [7, 7]


def test_a_report_without_runs_still_renders(tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path) -> None:
    report = _lodo(tiny_runs, tiny_artifact, tmp_path)
    del report["runs"]  # as the reports written before runs were recorded
    markdown = lodo.lodo_markdown(report)
    assert "Trained on" not in markdown and markdown.startswith("Leave one dataset out")


def test_every_aggregation_is_scored_and_the_served_one_is_the_headline(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    report = _lodo(tiny_runs, tiny_artifact, tmp_path)
    served = report["configuration"]["aggregation"]
    compared = 0
    for entry in report["datasets"].values():
        assert set(entry["by_aggregation"]) == {a.value for a in Aggregation}
        msp = entry["prr"]["msp"]
        for other in Aggregation:
            # The served aggregation is the `tad` column and the headline; the others have their own columns.
            column = "tad" if other.value == served else f"tad_{other.value}"
            tad, difference = entry["prr"][column], entry["by_aggregation"][other.value]["tad_minus_msp"]
            if tad is None or msp is None:  # PRR is undefined on a dataset the tiny model gets all wrong
                assert difference is None
            else:
                assert difference == pytest.approx(tad - msp)
                compared += 1
        if msp is not None and entry["prr"]["tad"] is not None:
            assert entry["tad_minus_msp"] == pytest.approx(entry["prr"]["tad"] - msp)
    assert compared >= len(Aggregation)  # at least one dataset with every PRR defined
    markdown = (tmp_path / "lodo.md").read_text()
    assert f"under each aggregation (the artifact's: {served})" in markdown
    assert f"aggregation {served}" in markdown  # the fit's configuration is printed


def test_alphas_can_be_overridden(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fitted: list[Choice] = []

    def recording_fit_final(*args: Any) -> Any:
        fitted.extend(args[3])
        return fit_final(*args)

    monkeypatch.setattr(lodo, "fit_final", recording_fit_final)
    default = _lodo(tiny_runs, tiny_artifact, tmp_path / "default")["configuration"]
    overridden = _lodo(tiny_runs, tiny_artifact, tmp_path / "override", "--alpha-stage1", "1000", "--alpha", "1e6")
    assert (overridden["configuration"]["alpha_stage1"], overridden["configuration"]["alpha"]) == (1000.0, 1e6)
    # Both datasets' fits used the artifact's alphas, then both used the overrides.
    assert [(c.alpha_stage1, c.alpha) for c in fitted] == [(default["alpha_stage1"], default["alpha"])] * 2 + [
        (1000.0, 1e6)
    ] * 2


def test_centring_can_be_overridden(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    centrings: list[TargetCentring] = []

    def recording_centred(texts: Any, centring: TargetCentring) -> Any:
        centrings.append(centring)
        return centred(texts, centring)

    monkeypatch.setattr(lodo, "centred", recording_centred)
    default = _lodo(tiny_runs, tiny_artifact, tmp_path / "default")["configuration"]["target_centring"]
    assert default != "group"  # so that the override is seen
    overridden = _lodo(tiny_runs, tiny_artifact, tmp_path / "override", "--centring", "group")
    assert overridden["configuration"]["target_centring"] == "group"
    # Both datasets' training texts were centred the artifact's way, then both fully.
    assert centrings == [TargetCentring(default)] * 2 + [TargetCentring.GROUP] * 2
    with pytest.raises(SystemExit):
        _lodo(tiny_runs, tiny_artifact, tmp_path / "bad", "--centring", "group-0.3")


def test_datasets_restricts_training_and_testing(
    tiny_runs: dict[str, Path],
    tiny_artifact: Path,
    tiny_data: dict[str, list[Path]],
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    # A third dataset: the squad records under another file stem (the stem names the dataset).
    source = next(path for path in tiny_data["train"] if path.name.startswith("squad"))
    copy = tmp_path / "triviaqa_train.jsonl"
    shutil.copy(source, copy)
    third = run_generate(
        GenerateOptions(
            data=[copy],
            out=tmp_path / "third",
            model=str(tiny_model_dir),
            dtype="float32",
            n_lags=N_LAGS,
            max_new_tokens=10,
        )
    )
    both = {"more_train": [third], "more_test": [third]}
    everything = _lodo(tiny_runs, tiny_artifact, tmp_path / "all", **both)
    assert set(everything["datasets"]) == {"squad", "mmlu", "triviaqa"}
    assert {e["train_texts"] for e in everything["datasets"].values()} == {48}  # the other two datasets
    restricted = _lodo(tiny_runs, tiny_artifact, tmp_path / "two", "--datasets", "squad", "mmlu", **both)
    assert restricted["configuration"]["datasets"] == ["mmlu", "squad"]
    assert set(restricted["datasets"]) == {"squad", "mmlu"}  # not tested on the third
    assert {e["train_texts"] for e in restricted["datasets"].values()} == {24}  # nor trained on it


def test_an_unknown_dataset_is_refused_by_name(tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--datasets: the training runs hold no nq_open"):
        _lodo(tiny_runs, tiny_artifact, tmp_path, "--datasets", "squad", "nq_open")


def test_one_dataset_is_refused(tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--datasets: name at least two"):
        _lodo(tiny_runs, tiny_artifact, tmp_path, "--datasets", "squad")


def test_training_runs_of_one_dataset_are_refused_not_reported_empty(
    tiny_runs: dict[str, Path],
    tiny_artifact: Path,
    tiny_model_dir: Path,
    tiny_data: dict[str, list[Path]],
    tmp_path: Path,
) -> None:
    from tests.conftest import tiny_run

    one = tiny_run(tiny_model_dir, tiny_data["train"][:1], tmp_path / "one")
    test = ["--test", str(tiny_runs["dev"]), "--artifact", str(tiny_artifact), "--out", str(tmp_path / "lodo")]
    with pytest.raises(SystemExit, match="lodo needs training runs holding at least two datasets"):
        main(["lodo", str(one), *test])
    assert not (tmp_path / "lodo" / "lodo.json").exists()


def test_a_test_answer_given_twice_is_refused(tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path) -> None:
    """Counted twice, it would narrow the intervals."""
    with pytest.raises(SystemExit, match="more than once"):
        _lodo(tiny_runs, tiny_artifact, tmp_path / "lodo", more_test=[tiny_runs["dev"]])


def test_an_out_that_cannot_hold_the_report_is_refused_before_any_refit(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = tmp_path / "taken"
    taken.write_text("")
    with pytest.raises(SystemExit) as refused:
        _lodo(tiny_runs, tiny_artifact, taken)
    assert refused.value.code == 2 and "is a file" in capsys.readouterr().err


@pytest.mark.parametrize("side", ["train", "test"])
@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [("model_sha256", "0" * 64, "another model"), ("n_lags", 1, "stores 1 lags"), ("dtype", "bfloat16", "in bfloat16")],
)
def test_runs_the_artifact_cannot_score_are_refused(
    side: str,
    setting: str,
    value: object,
    message: str,
    tiny_runs: dict[str, Path],
    tiny_artifact: Path,
    tmp_path: Path,
) -> None:
    from tests.training.test_run_source import altered_run

    altered = altered_run(tiny_runs["train" if side == "train" else "dev"], tmp_path, **{setting: value})
    runs = {**tiny_runs, ("train" if side == "train" else "dev"): altered}
    with pytest.raises(SystemExit, match=message):
        _lodo(runs, tiny_artifact, tmp_path / "out")


def _record_mlp_refits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[Any, ...], Any]]:
    """Each `fit_final_mlp` call lodo makes: its arguments and the network it returned, in order."""
    refits: list[tuple[tuple[Any, ...], Any]] = []
    real_fit_final_mlp = lodo.fit_final_mlp

    def recording_fit_final_mlp(*args: Any) -> Any:
        refits.append((args, real_fit_final_mlp(*args)))
        return refits[-1][1]

    monkeypatch.setattr(lodo, "fit_final_mlp", recording_fit_final_mlp)
    return refits


def test_an_mlp_artifact_is_refitted_as_an_mlp(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sklearn.neural_network import MLPRegressor

    refits = _record_mlp_refits(monkeypatch)

    def no_ridge(*args: Any) -> Any:
        raise AssertionError("an MLP artifact was refitted with a ridge stage 2")

    monkeypatch.setattr(lodo, "fit_final", no_ridge)
    artifact = as_mlp_artifact(tiny_artifact, tmp_path / "mlp")
    report = _lodo(tiny_runs, artifact, tmp_path / "lodo")
    assert report["configuration"]["stage2"] == {
        "mlp": {"layers": 2, "epochs": 3, "learning_rate": 1e-3, "batch_size": 64},
        "width": 8,
    }
    assert report["configuration"]["alpha"] is None  # no stage-2 ridge
    with pytest.raises(SystemExit, match="--alpha: the artifact's stage 2 is an MLP"):
        _lodo(tiny_runs, artifact, tmp_path / "alpha", "--alpha", "1")
    assert "alpha None" not in (tmp_path / "lodo" / "lodo.md").read_text()
    # One MLP per held-out dataset, with the artifact's shape.
    fitted = [network for _, network in refits]
    assert len(fitted) == 2
    assert all(isinstance(m, MLPRegressor) and m.hidden_layer_sizes == (8, 8) for m in fitted)
    assert all(entry["prr"]["tad"] is None or np.isfinite(entry["prr"]["tad"]) for entry in report["datasets"].values())


def _record_scored_regressors(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The stage 2s lodo scores with, one per held-out dataset, in order."""
    scored: list[Any] = []
    real_scorer = lodo.TadScorer

    def recording_scorer(regressor: Any, *args: Any) -> Any:
        scored.append(regressor)
        return real_scorer(regressor, *args)

    monkeypatch.setattr(lodo, "TadScorer", recording_scorer)
    return scored


def test_an_averaged_artifact_is_refitted_as_the_mean_of_a_ridge_and_an_mlp(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sklearn.linear_model import Ridge
    from sklearn.neural_network import MLPRegressor

    scored = _record_scored_regressors(monkeypatch)
    artifact = as_mlp_artifact(tiny_artifact, tmp_path / "averaged", averaged=True)
    report = _lodo(tiny_runs, artifact, tmp_path / "lodo", "--alpha", "3")
    assert report["configuration"]["averaged_with_ridge"] is True
    assert report["configuration"]["alpha"] == 3.0  # the ridge member's, which --alpha may change
    assert "averaged_with_ridge True" in (tmp_path / "lodo" / "lodo.md").read_text()
    assert len(scored) == 2 and all(isinstance(r, AveragedRegressor) for r in scored)
    for regressor in scored:
        ridge, mlp = regressor.members
        assert isinstance(ridge, Ridge) and ridge.alpha == 3.0
        assert isinstance(mlp, MLPRegressor) and mlp.hidden_layer_sizes == (8, 8)


@pytest.mark.parametrize("params", [{"seeds": 2}, {"standardised_inputs": True}])
def test_an_mlp_fitted_by_a_removed_option_is_refused(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, params: dict[str, Any]
) -> None:
    """`fit --mlp-seeds` and `--mlp-standardise` are gone: their artifacts are not refitted as something else."""
    artifact = as_mlp_artifact(tiny_artifact, tmp_path / "mlp", averaged=True)
    manifest = json.loads((artifact / "manifest.json").read_text())
    manifest["regressor"]["params"].update(params)
    (artifact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="fitted with fit --mlp-seeds or --mlp-standardise"):
        _lodo(tiny_runs, artifact, tmp_path / "lodo")
    assert not (tmp_path / "lodo").exists()


def test_held_out_restricts_testing_not_training(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    report = _lodo(tiny_runs, tiny_artifact, tmp_path / "one", "--held-out", "squad")
    assert set(report["datasets"]) == {"squad"}
    assert report["datasets"]["squad"]["train_texts"] == 24  # every other dataset, as without --held-out
    assert report["configuration"]["datasets"] == ["mmlu", "squad"]
    with pytest.raises(SystemExit, match="--held-out: nq_open is not in both"):
        _lodo(tiny_runs, tiny_artifact, tmp_path / "unknown", "--held-out", "nq_open")


class Interrupted(Exception):
    """Stands for lodo being stopped (Ctrl-C, a lost machine) between two held-out datasets."""


def test_an_interrupted_lodo_resumes_from_its_finished_datasets(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each held-out dataset is a refit (minutes for an MLP): a rerun reads the finished ones back and refits only
    the rest, with the report of a lodo never stopped; other options read none of them; a finished lodo keeps none."""
    whole = _lodo(tiny_runs, tiny_artifact, tmp_path / "whole")
    assert not (tmp_path / "whole" / lodo.PROGRESS_DIR).exists()
    refitted: list[str] = []
    held_out = lodo._held_out

    def recorded(dataset: str, *args: Any, stop_at: str | None = None) -> Any:
        if dataset == stop_at:
            raise Interrupted
        refitted.append(dataset)
        return held_out(dataset, *args)

    monkeypatch.setattr(lodo, "_held_out", lambda *args: recorded(*args, stop_at="squad"))
    with pytest.raises(Interrupted):
        _lodo(tiny_runs, tiny_artifact, tmp_path / "resumed")
    assert refitted == ["mmlu"] and not (tmp_path / "resumed" / "lodo.json").exists()
    monkeypatch.setattr(lodo, "_held_out", recorded)
    refitted.clear()
    shutil.copytree(tmp_path / "resumed", tmp_path / "other")
    _lodo(tiny_runs, tiny_artifact, tmp_path / "other", "--alpha", "0.5")
    assert refitted == ["mmlu", "squad"]  # another alpha: the stopped lodo's dataset is not its own
    refitted.clear()
    resumed = _lodo(tiny_runs, tiny_artifact, tmp_path / "resumed")
    assert refitted == ["squad"]
    assert json.dumps(resumed) == json.dumps(whole)
    assert (tmp_path / "resumed" / "lodo.md").read_text() == (tmp_path / "whole" / "lodo.md").read_text()
    assert not (tmp_path / "resumed" / lodo.PROGRESS_DIR).exists()


def test_a_held_out_lodo_keeps_what_a_stopped_full_one_finished_of_other_datasets(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held_out = lodo._held_out

    def stopped_at_squad(dataset: str, *args: Any) -> Any:
        if dataset == "squad":
            raise Interrupted
        return held_out(dataset, *args)

    monkeypatch.setattr(lodo, "_held_out", stopped_at_squad)
    with pytest.raises(Interrupted):
        _lodo(tiny_runs, tiny_artifact, tmp_path)  # mmlu finished
    monkeypatch.setattr(lodo, "_held_out", held_out)
    _lodo(tiny_runs, tiny_artifact, tmp_path, "--held-out", "squad")
    (store,) = (tmp_path / lodo.PROGRESS_DIR).iterdir()
    assert [item.name for item in store.iterdir()] == ["mmlu.json"]  # for the full lodo's rerun


def test_a_saved_entry_of_another_version_is_refitted() -> None:
    assert lodo._finished({"entry": {"n": 3}, "samples": None}) is None
    assert lodo._finished({"entry": dict.fromkeys(lodo.ENTRY_KEYS), "samples": [0.5]}) is not None


def test_each_held_out_dataset_is_resampled_with_its_own_seed(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mean's interval assumes the datasets' resamples independent: one seed would draw the same positions
    in both tiny datasets (16 answers each). A dataset's seed does not depend on which others are held out."""
    seeds: dict[str, list[int]] = {}
    bootstrap = lodo.paired_bootstrap_prr

    def recorded(scores: Any, quality: np.ndarray, resamples: int, seed: int) -> Any:
        seeds.setdefault(name, []).append(seed)
        return bootstrap(scores, quality, resamples, seed)

    monkeypatch.setattr(lodo, "paired_bootstrap_prr", recorded)
    name = "all"
    _lodo(tiny_runs, tiny_artifact, tmp_path / "all")
    name = "squad"
    _lodo(tiny_runs, tiny_artifact, tmp_path / "squad", "--held-out", "squad")
    assert len(seeds["all"]) == 2 and len(set(seeds["all"])) == 2
    assert seeds["squad"] == [seeds["all"][1]]  # sorted: mmlu, then squad
