"""A calibration-only artifact: no regressor, a free decision method chosen on one part of the records, every
threshold certified on the other."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.uncertainty.artifact import ArtifactError, load_artifact
from app.uncertainty.methods import REGISTRY, Method
from tests.fixtures.labelled_artifact import half_right, labelled_by_score, relabelled_copy
from training.calibration_artifact import CalibrationArtifactOptions, build_calibration_artifact, selection_part
from training.check_pass_scores import CheckPassOptions
from training.cli import main
from training.runs import CHECK_PASS_FILE, iter_texts


def test_it_has_no_regressor_and_decides_with_a_free_method(tiny_calibration_artifact: Path) -> None:
    artifact = load_artifact(tiny_calibration_artifact)
    manifest = artifact.manifest
    assert manifest.regressor is None and not artifact.has_regressor
    with pytest.raises(ArtifactError, match="calibration-only"):
        artifact.trained()
    method = artifact.decision_method
    assert not REGISTRY[method.value].needs_regressor
    assert manifest.default_target is not None and manifest.default_target in manifest.thresholds[method]
    assert manifest.dtype == "float32" and manifest.features.n_lags == 4
    decision = manifest.metrics["decision"]
    assert decision["reference"] == "msp" and decision["chosen"] == method.value
    assert decision["informative_datasets"]


def test_the_method_is_chosen_on_one_part_and_certified_on_the_other(
    tiny_calibration_artifact: Path, tiny_runs: dict[str, Path]
) -> None:
    manifest = load_artifact(tiny_calibration_artifact).manifest
    split = manifest.metrics["decision"]["split"]
    texts = list(iter_texts([tiny_runs["train"]]))
    assert split["selection_answers"] + split["certification_answers"] == len(texts)
    assert manifest.metrics["calibration"]["n"] == split["certification_answers"]
    for entries in manifest.thresholds.values():
        assert all(entry.n == split["certification_answers"] for entry in entries.values())
    report = json.loads((tiny_calibration_artifact / "report" / "report.json").read_text())
    assert sum(row["n"] for row in report["certification"].values()) == split["certification_answers"]
    # The default target too is chosen on the selection part, so its certificate holds at 1 - delta.
    assert split["default_target"].startswith("keep-half on the")
    if split["default_target"].startswith("keep-half on the selection"):
        assert manifest.default_target in split["default_target"]


def test_the_default_target_is_chosen_on_the_selection_records(tiny_runs: dict[str, Path]) -> None:
    from app.uncertainty.methods import Method
    from training.calibration import CalibrationTargets
    from training.calibration_artifact import _default_target

    rng = np.random.default_rng(0)
    n = 400
    wrong = rng.uniform(size=n) < 0.5
    scores = np.where(wrong, rng.uniform(0.3, 1.0, n), rng.uniform(0.0, 0.7, n))  # ranks wrong answers higher
    quality = (~wrong).astype(float)
    selecting = np.arange(n) < n // 2
    targets = CalibrationTargets(coverages=[0.5], errors=[0.2, 0.3, 0.4, 0.5], delta=0.05)
    chosen, rule = _default_target({"msp": scores}, quality, selecting, Method("msp"), targets)
    assert rule.startswith("keep-half on the selection records") and chosen.startswith("error@")
    # Labels swapped on the certification half only: the selection's choice cannot be certified there.
    flipped = quality.copy()
    flipped[~selecting] = 1 - flipped[~selecting]
    chosen, rule = _default_target({"msp": scores}, flipped, selecting, Method("msp"), targets)
    assert chosen == "keep-half" and "not certified there" in rule


def test_the_split_is_by_record_and_does_not_depend_on_order(tiny_runs: dict[str, Path]) -> None:
    texts = list(iter_texts([tiny_runs["train"]]))
    chosen = selection_part(texts, 0.5, seed=0)
    assert dict(zip([t.key for t in texts], chosen, strict=True)) == dict(
        zip([t.key for t in reversed(texts)], selection_part(texts[::-1], 0.5, seed=0), strict=True)
    )
    assert 0 < chosen.sum() < len(texts)
    assert not np.array_equal(chosen, selection_part(texts, 0.5, seed=1))


def test_dev_records_and_a_missing_source_are_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    tiny_data: dict[str, list[Path]],
    tiny_runs: dict[str, Path],
) -> None:
    dev = [path for path in tiny_data["dev"]]
    with pytest.raises(SystemExit) as refused:
        main(["calibration-artifact", "--out", str(tmp_path / "a"), "--data", *map(str, dev)])
    assert refused.value.code == 2 and "never from dev" in capsys.readouterr().err
    # a run generated from dev files, as its settings name them
    with pytest.raises(SystemExit) as refused:
        main(["calibration-artifact", "--out", str(tmp_path / "a"), "--run", str(tiny_runs["dev"])])
    assert refused.value.code == 2 and "never from dev" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main(["calibration-artifact", "--out", str(tmp_path / "a")])
    assert refused.value.code == 2 and "--data" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        no_targets = ["--coverage", "--error"]
        main(["calibration-artifact", "--out", str(tmp_path / "a"), "--data", str(tiny_data["train"][0]), *no_targets])
    assert refused.value.code == 2 and "at least one --coverage or --error" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    "extra", [["--limit", "3"], ["--model", "other"], ["--dtype", "bfloat16"], ["--prompt-style", "task"]]
)
def test_generation_options_with_run_are_refused_not_ignored(
    extra: list[str], tmp_path: Path, tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["calibration-artifact", "--out", str(tmp_path / "a"), "--run", str(tiny_runs["train"]), *extra])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and extra[0] in err
    assert "only applies when generating: with --run, leave it out" in err


def test_a_trained_artifact_at_out_is_refused_before_generating(
    tmp_path: Path, tiny_artifact: Path, tiny_data: dict[str, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    trained = Path(shutil.copytree(tiny_artifact, tmp_path / "trained"))
    with pytest.raises(SystemExit) as refused:
        main(["calibration-artifact", "--out", str(trained), "--data", *map(str, tiny_data["train"])])
    assert refused.value.code == 2 and "holds a trained artifact" in capsys.readouterr().err
    assert not (trained / "calibration-run").exists()


def test_p_true_is_the_reference_where_the_model_can_be_asked(tiny_p_true_artifact: Path) -> None:
    manifest = load_artifact(tiny_p_true_artifact).manifest
    decision = manifest.metrics["decision"]
    assert decision["reference"] == "p_true" and decision["chosen"] == "p_true"
    assert manifest.decision_method == Method("p_true")
    assert manifest.default_target in manifest.thresholds[Method("p_true")]
    report = json.loads((tiny_p_true_artifact / "report" / "report.json").read_text())
    assert all("p_true" in row["prr"] for row in report["certification"].values())


def test_a_score_that_ranks_clearly_better_replaces_p_true(
    tmp_path_factory: pytest.TempPathFactory, tiny_runs: dict[str, Path]
) -> None:
    manifest = load_artifact(labelled_by_score(tmp_path_factory, tiny_runs["train"], "msp")).manifest
    decision = manifest.metrics["decision"]
    assert decision["reference"] == "p_true" and decision["challenger"] == "msp" and decision["interval"][0] > 0
    assert manifest.decision_method == Method("msp")


def test_the_command_asks_the_check_unless_told_not_to(tmp_path: Path, tiny_runs: dict[str, Path]) -> None:
    run = relabelled_copy(tiny_runs["train"], tmp_path / "train", half_right)
    common = ["--run", str(run), "--error", "0.5", "0.9", "--delta", "0.2", "--resamples", "20"]
    main(["calibration-artifact", "--out", str(tmp_path / "with"), *common])
    main(["calibration-artifact", "--out", str(tmp_path / "without"), "--no-check-pass", *common])
    assert Method("p_true") in load_artifact(tmp_path / "with").manifest.thresholds
    assert (run / CHECK_PASS_FILE).is_file()
    assert Method("p_true") not in load_artifact(tmp_path / "without").manifest.thresholds


def test_few_shot_answers_leave_p_true_out_and_msp_is_the_reference(tmp_path: Path, tiny_runs: dict[str, Path]) -> None:
    # As if asked few-shot: no user turn to quote.
    run = relabelled_copy(
        tiny_runs["train"], tmp_path / "train", lambda i, text: {**half_right(i, text), "prompt_style": "few-shot"}
    )
    manifest = build_calibration_artifact(
        CalibrationArtifactOptions(
            out=tmp_path / "a", runs=[run], errors=(0.5, 0.9), delta=0.2, resamples=20, check_pass=CheckPassOptions()
        )
    )
    assert manifest.metrics["decision"]["reference"] == "msp" and Method("p_true") not in manifest.thresholds
    assert not (run / CHECK_PASS_FILE).exists()


def test_a_rebuild_killed_before_its_manifest_leaves_no_report_of_another_build(
    tiny_calibration_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest does not hash the report: a kill between the two must not leave the old artifact, which
    loads, beside the new build's report."""
    import training.calibration_artifact as calibration_artifact

    out = tmp_path / "artifact"
    shutil.copytree(tiny_calibration_artifact, out)
    assert (out / calibration_artifact.REPORT).is_file()

    def killed(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(calibration_artifact, "write_manifest", killed)
    with pytest.raises(KeyboardInterrupt):
        calibration_artifact._write(out, load_artifact(out).manifest, {"another": "build"})
    assert not (out / calibration_artifact.REPORT).exists()
    load_artifact(out)  # the earlier artifact, whole
