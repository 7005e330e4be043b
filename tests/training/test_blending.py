"""`blend`: the candidates, the choice, its cross-validation, and the refusals."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.uncertainty.artifact import BlendInfo, load_artifact, write_manifest
from app.uncertainty.methods import BASELINES, Method
from training.blending import (
    POOLED_TOLERANCE,
    TAD_ALONE,
    UNSUPERVISED,
    Answers,
    Standardisation,
    candidates,
    choose,
    cross_validate,
    evaluate_candidates,
    measure_out_of_fold,
    run_blend,
)
from training.calibration import run_calibrate
from training.rejection import prediction_rejection_ratio
from training.run_source import RunSource


def test_candidates_are_tad_alone_then_each_partner_at_each_weight() -> None:
    options = candidates((0.2, 0.5))
    assert options[0].name == TAD_ALONE and options[0].weights == {"tad": 1.0}
    assert len(options) == 1 + 2 * (len(BASELINES) + 1)
    for option in options[1:]:
        assert sum(option.weights.values()) == pytest.approx(1.0)
        assert option.weights["tad"] in (pytest.approx(0.8), pytest.approx(0.5))
    mixed = next(o for o in options if o.name.startswith("tad + 0.2 mean("))
    assert set(mixed.weights) == {"tad", *UNSUPERVISED}
    assert all(mixed.weights[m] == pytest.approx(0.2 / len(UNSUPERVISED)) for m in UNSUPERVISED)


def test_standardisation_is_taken_on_the_given_rows_and_empty_answers_stay_most_uncertain() -> None:
    table = {"tad": np.array([1.0, 3.0, 100.0, math.inf]), "msp": np.array([2.0, 4.0, 6.0, math.inf])}
    rows = np.array([True, True, False, True])
    standardisation = Standardisation.of(table, rows)
    assert standardisation.means["tad"] == pytest.approx(2.0) and standardisation.scales["tad"] == pytest.approx(1.0)
    option = candidates((0.5,))[1 + [m.value for m in BASELINES].index("msp")]
    scores = standardisation.score(option, table)
    assert scores[0] == pytest.approx(0.5 * (1 - 2) / 1 + 0.5 * (2 - 3) / 1)
    assert scores[3] == math.inf


def _answers(rng: np.random.Generator, per_group: int = 200) -> Answers:
    """Two groups at different accuracy. TAD knows the group's level but ranks within a group only weakly;
    perplexity ranks within groups well but knows nothing of the level."""
    groups, quality, tad, perplexity = [], [], [], []
    for group, accuracy in (("a/task", 0.6), ("b/chat", 0.3)):
        right = rng.random(per_group) < accuracy
        groups += [group] * per_group
        quality += list(right.astype(float))
        tad += list((1 - accuracy) + 0.05 * rng.standard_normal(per_group) - 0.02 * right)
        perplexity += list(rng.standard_normal(per_group) - 1.5 * right)
    table = {name: rng.standard_normal(len(quality)) for name in {n for c in candidates() for n in c.weights}}
    table["tad"], table["perplexity"] = np.array(tad), np.array(perplexity)
    keys = np.array([f"record-{i // 2}" for i in range(len(quality))])  # two answers per record
    return Answers(table, np.array(quality), np.array(groups), keys, ["a/task", "b/chat"])


def test_the_choice_takes_the_partner_that_ranks_within_groups_and_cross_validation_keeps_it() -> None:
    answers = _answers(np.random.default_rng(0))
    options = candidates()
    everything = np.ones(len(answers.quality), dtype=bool)
    _, grid = evaluate_candidates(answers, everything, options)
    best = options[choose(grid)]
    assert "perplexity" in best.name
    assert grid[options.index(best)]["within_group_prr"] > grid[0]["within_group_prr"] + 0.1
    assert grid[options.index(best)]["pooled_prr"] >= grid[0]["pooled_prr"] - POOLED_TOLERANCE
    validation = cross_validate(answers, options, folds=5, seed=0, resamples=200, fixed=None)
    assert validation["kept"] and validation["gain"]["ci95"][0] > 0
    within = validation["within_group_prr"]
    assert validation["gain"]["mean"] == pytest.approx(within["blend"] - within[TAD_ALONE])


def test_noise_partners_are_not_kept() -> None:
    answers = _answers(np.random.default_rng(1))
    answers.table["perplexity"] = np.random.default_rng(2).standard_normal(len(answers.quality))
    options = candidates()
    validation = cross_validate(answers, options, folds=5, seed=0, resamples=200, fixed=None)
    assert not validation["kept"]


def test_out_of_fold_measurement_chooses_and_cross_validates_as_blend_does() -> None:
    answers = _answers(np.random.default_rng(0))
    measured = measure_out_of_fold(answers.table, answers.quality, answers.groups, answers.keys, resamples=200)
    assert measured["informative_groups"] == ["a/task", "b/chat"]
    assert "perplexity" in measured["chosen"]
    assert measured["best_candidates"][0]["candidate"] == measured["chosen"]
    everything = np.ones(len(answers.quality), dtype=bool)
    assert measured["n"] == len(answers.quality)
    assert measured["tad_alone"]["candidate"] == TAD_ALONE
    assert measured["tad_alone"]["within_group_prr"] == pytest.approx(
        answers.within_group(answers.table[TAD_ALONE], everything)
    )
    # Nested: every fold chooses on the others (five choices), and the chosen blend is kept.
    assert len(measured["cv"]["chosen_per_fold"]) == 5
    assert measured["cv"]["kept"] and measured["cv"]["gain"]["ci95"][0] > 0


def test_out_of_fold_measurement_with_fewer_records_than_folds_says_so() -> None:
    answers = _answers(np.random.default_rng(5))
    four_records = np.array([f"record-{i % 4}" for i in range(len(answers.quality))])
    measured = measure_out_of_fold(answers.table, answers.quality, answers.groups, four_records, resamples=50)
    assert "skipped" in measured and "cv" not in measured


def test_out_of_fold_measurement_without_an_informative_group_says_so() -> None:
    answers = _answers(np.random.default_rng(4))
    always_right = np.ones(len(answers.quality))
    measured = measure_out_of_fold(answers.table, always_right, answers.groups, answers.keys, resamples=50)
    assert measured["informative_groups"] == [] and "skipped" in measured


def test_choose_refuses_candidates_that_give_up_the_pooled_ranking() -> None:
    grid = [
        {"candidate": "tad", "within_group_prr": 0.2, "pooled_prr": 0.7},
        {"candidate": "better within, far worse pooled", "within_group_prr": 0.5, "pooled_prr": 0.6},
        {"candidate": "a little better", "within_group_prr": 0.25, "pooled_prr": 0.69},
    ]
    assert choose(grid) == 2


def test_within_group_prr_is_the_mean_over_informative_groups() -> None:
    answers = _answers(np.random.default_rng(3))
    everything = np.ones(len(answers.quality), dtype=bool)
    scores = answers.table["perplexity"]
    expected = np.mean(
        [
            prediction_rejection_ratio(scores[answers.groups == g], answers.quality[answers.groups == g])
            for g in answers.informative_groups
        ]
    )
    assert answers.within_group(scores, everything) == pytest.approx(expected)


def test_blend_refuses_the_runs_the_regressor_was_fitted_on(tiny_runs: dict[str, Path], tiny_artifact: Path) -> None:
    with pytest.raises(SystemExit, match="fitted on"):
        run_blend(tiny_artifact, [tiny_runs["train"]], force=True)


def test_blend_refuses_when_the_training_runs_cannot_be_checked(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    """An artifact from elsewhere lists training runs not on this disk: its own answers could pass unseen."""
    artifact_dir = tmp_path / "moved"
    shutil.copytree(tiny_artifact, artifact_dir)
    manifest = load_artifact(artifact_dir).manifest
    gone = str(tmp_path / "elsewhere" / "train-run")
    write_manifest(artifact_dir, manifest.model_copy(update={"training": {**manifest.training, "runs": [gone]}}))
    with pytest.raises(SystemExit, match="--unchecked-training-runs") as refused:
        run_blend(artifact_dir, [tiny_runs["train"]], force=True)
    assert gone in str(refused.value)
    # Vouched for, it goes on (here with the very answers it was fitted on, which only the caller could know).
    chosen = run_blend(
        artifact_dir, [tiny_runs["train"]], force=True, candidate=TAD_ALONE, resamples=20, unchecked_training_runs=True
    )
    assert chosen.metrics["blend"]["chosen"] == TAD_ALONE


def test_answers_given_twice_are_refused(tiny_runs: dict[str, Path], tiny_artifact: Path) -> None:
    with pytest.raises(SystemExit, match="more than once"):
        run_blend(tiny_artifact, [tiny_runs["dev"], tiny_runs["dev"]], force=True)


def test_a_forced_blend_is_installed_calibrated_and_scores_what_it_stores(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    artifact_dir = tmp_path / "blended"
    shutil.copytree(tiny_artifact, artifact_dir)
    name = "tad + 0.3 perplexity"
    manifest = run_blend(artifact_dir, [tiny_runs["dev"]], force=True, candidate=name, resamples=50)
    assert manifest.blend is not None and manifest.metrics["blend"]["chosen"] == name
    assert [t.method for t in manifest.blend.terms] == [Method.TAD, Method.PERPLEXITY]
    assert [t.weight for t in manifest.blend.terms] == pytest.approx([0.7, 0.3])
    run_calibrate(
        artifact_dir,
        RunSource(data=[], runs=[tiny_runs["dev"]], default_run_dir=tmp_path / "unused"),
        coverages=[0.5],
        errors=[],
        delta=0.1,
    )
    artifact = load_artifact(artifact_dir)
    assert artifact.decision_method is Method.TAD_BLEND
    assert "coverage@0.5" in artifact.manifest.thresholds[Method.TAD_BLEND]
    assert artifact.manifest.default_target == "coverage@0.5"


def test_a_blend_cannot_contain_itself() -> None:
    with pytest.raises(ValueError, match="itself"):
        BlendInfo.model_validate({"terms": [{"method": "tad_blend", "weight": 1.0, "mean": 0.0, "scale": 1.0}]})
    with pytest.raises(ValueError):
        BlendInfo.model_validate({"terms": [{"method": "tad", "weight": 1.0, "mean": 0.0, "scale": 0.0}]})


@pytest.mark.parametrize(
    ("setting", "value", "message"), [("model_sha256", "0" * 64, "another model"), ("n_lags", 1, "stores 1 lags")]
)
def test_blend_refuses_runs_the_artifact_cannot_score(
    setting: str, value: object, message: str, tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    from tests.training.test_run_source import altered_run

    artifact_dir = tmp_path / "artifact"
    shutil.copytree(tiny_artifact, artifact_dir)
    before = (artifact_dir / "manifest.json").read_text()
    run = altered_run(tiny_runs["dev"], tmp_path, **{setting: value})
    with pytest.raises(SystemExit, match=message):
        run_blend(artifact_dir, [run], force=True, candidate="tad + 0.3 perplexity", resamples=10)
    assert (artifact_dir / "manifest.json").read_text() == before


def test_blend_refuses_the_answers_it_was_fitted_on_when_the_style_was_called_bare(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    """Fitted on a run made before the chat style's rename, the same answers in a run made since are its own."""
    from tests.training.fit import QUICK_FIT
    from tests.training.test_runs import restyled
    from training.fit.options import FitOptions
    from training.fit.pipeline import run_fit

    old = restyled(tiny_runs["dev"], tmp_path / "old", "bare")
    new = restyled(tiny_runs["dev"], tmp_path / "new", "chat")
    run_fit(FitOptions(runs=[old], out=tmp_path / "artifact", **QUICK_FIT))
    with pytest.raises(SystemExit, match="were in the regressor's training runs"):
        run_blend(tmp_path / "artifact", [new], force=True, candidate=TAD_ALONE, resamples=10)
