"""`evaluate --compare-artifact`: another artifact's default score beside this one's, paired per dataset."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.training.killed_writes import killed_writing
from training.evaluation import COMPARED_SCORE, report_markdown, run_evaluate
from training.fit.options import FitOptions
from training.fit.pipeline import run_fit
from training.run_source import RunSource
from training.runs import RUN_FILE, read_run_settings


def _source(tiny_runs: dict[str, Path], tmp_path: Path) -> RunSource:
    return RunSource(data=[], runs=[tiny_runs["dev"]], default_run_dir=tmp_path / "unused")


def test_the_compared_artifacts_score_and_the_paired_difference_are_reported(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    run_fit(FitOptions(runs=[tiny_runs["train"]], out=other, alphas=(100.0,)))
    report = run_evaluate(tiny_artifact, _source(tiny_runs, tmp_path), tmp_path / "report", 50, other)
    assert report["compared_artifact"] == str(other)
    assert "mean_default_minus_compared_informative_ci95" in report
    default = report["artifact"]["decision_method"]
    for entry in report["datasets"].values():
        methods = entry["methods"]
        versus = entry["default_vs_compared"]
        if methods[default]["prr"] is None or methods[COMPARED_SCORE]["prr"] is None:
            continue
        assert versus["difference"] == pytest.approx(methods[default]["prr"] - methods[COMPARED_SCORE]["prr"])
    assert "compared artifact" in report_markdown(report)
    assert json.loads((tmp_path / "report" / "report.json").read_text())["compared_artifact"] == str(other)


def test_an_artifact_compared_with_itself_differs_by_nothing(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    report = run_evaluate(tiny_artifact, _source(tiny_runs, tmp_path), tmp_path / "report", 50, tiny_artifact)
    differences = [e["default_vs_compared"]["difference"] for e in report["datasets"].values()]
    assert all(d == 0.0 for d in differences if d is not None) and any(d is not None for d in differences)


def test_an_artifact_of_answers_in_another_dtype_is_not_compared(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    """The runs are the evaluated artifact's dtype: the other's features would be scored on numbers it never saw."""
    other = Path(shutil.copytree(tiny_artifact, tmp_path / "bf16"))
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps({**manifest, "dtype": "bfloat16"}))
    with pytest.raises(SystemExit, match="trained on answers in bfloat16"):
        run_evaluate(tiny_artifact, _source(tiny_runs, tmp_path), tmp_path / "report", 0, other)


def test_a_run_made_with_the_attention_to_the_prompt_is_scored_as_before(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    """Runs that `generate --prompt-attention` made (removed since) hold hundreds more statistics and say so in
    their settings: they are still read, and score as the same answers without them."""
    annotated = tmp_path / "annotated-run"
    shutil.copytree(tiny_runs["dev"], annotated)
    for entropy in annotated.glob("shards/*/stat-entropy.npy"):
        for name in ("prompt_mass_l00_h0", "prompt_sink_l00_h0"):
            shutil.copy(entropy, entropy.with_name(f"stat-{name}.npy"))
    settings = read_run_settings(annotated)
    (annotated / RUN_FILE).write_text(json.dumps({**settings, "prompt_attention": True}))
    plain = run_evaluate(tiny_artifact, _source(tiny_runs, tmp_path), tmp_path / "plain", 0)
    source = RunSource(data=[], runs=[annotated], default_run_dir=tmp_path / "unused")
    report = run_evaluate(tiny_artifact, source, tmp_path / "annotated", 0)
    assert report["datasets"] and report["datasets"] == plain["datasets"]


def test_an_artifact_of_another_model_is_refused(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other-model"
    shutil.copytree(tiny_artifact, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["llm"]["sha256"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="different model"):
        run_evaluate(tiny_artifact, _source(tiny_runs, tmp_path), tmp_path / "report", 0, other)


def test_a_rerun_into_the_same_folder_leaves_no_curve_of_the_earlier_report(
    tiny_artifact: Path, tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "report"
    out.mkdir()
    (out / "rejection_gone_dataset.png").write_bytes(b"an earlier report's curve")
    run_evaluate(tiny_artifact, _source(tiny_runs, tmp_path), out, 0)
    curves = {path.name for path in out.glob("rejection_*.png")}
    assert "rejection_gone_dataset.png" not in curves and "rejection_overall.png" in curves


def test_an_evaluation_killed_as_it_writes_leaves_no_report_made_of_two(
    tiny_artifact: Path, tiny_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """report.json comes last, an earlier report gone before: without it the folder is plainly unfinished."""
    import training.evaluation as evaluation

    out = tmp_path / "report"
    run_evaluate(tiny_artifact, _source(tiny_runs, tmp_path), out, 0)
    write = evaluation.write_text_atomic
    monkeypatch.setattr(evaluation, "write_text_atomic", killed_writing("report.md", write))
    with pytest.raises(KeyboardInterrupt):
        run_evaluate(tiny_artifact, _source(tiny_runs, tmp_path), out, 0)
    assert not (out / "report.json").exists() and not (out / "report.md").exists()
    monkeypatch.setattr(evaluation, "write_text_atomic", write)
    run_evaluate(tiny_artifact, _source(tiny_runs, tmp_path), out, 0)
    assert (out / "report.json").is_file() and (out / "report.md").is_file()


def test_an_artifact_deciding_with_p_true_is_evaluated_with_it(
    tiny_runs: dict[str, Path], tiny_p_true_artifact: Path, tmp_path: Path
) -> None:
    dev = Path(shutil.copytree(tiny_runs["dev"], tmp_path / "dev"))  # the check's values are written into the run
    source = RunSource(data=[], runs=[dev], default_run_dir=tmp_path / "unused")
    report = run_evaluate(tiny_p_true_artifact, source, tmp_path / "report", 20)
    assert report["artifact"]["decision_method"] == "p_true"
    for entry in report["datasets"].values():
        assert "p_true" in entry["methods"] and entry["default_vs_best_baseline"]["best_baseline"] != "p_true"
    policy = report["default_policy"]
    assert policy is not None and policy["method"] == "p_true" and policy["overall"]["n"] > 0


def test_each_dataset_is_resampled_independently(tiny_runs: dict[str, Path], tiny_artifact: Path) -> None:
    """The interval of the mean over datasets averages their resamples one by one, which assumes them
    independent: two datasets holding the same answers must not be resampled at the same positions."""
    from dataclasses import replace

    from app.uncertainty.artifact import load_artifact
    from training.evaluation import build_report
    from training.runs import iter_texts

    texts = list(iter_texts([tiny_runs["dev"]]))
    twins = [replace(t, meta={**t.meta, "dataset": name, "key": f"{name}/{t.key}"}) for name in "ab" for t in texts]
    report, _ = build_report(load_artifact(tiny_artifact), twins, resamples=200)
    a, b = (report["datasets"][name]["methods"]["msp"] for name in "ab")
    assert a["prr"] == b["prr"] and a["prr_ci95"] != b["prr_ci95"]


def test_the_artifacts_calibration_runs_are_flagged_when_evaluated_on(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its thresholds were certified on them: the default policy's figures there are partly in sample."""
    from app.uncertainty.artifact import load_artifact
    from training.evaluation import calibration_runs_among

    artifact = load_artifact(tiny_artifact)
    assert calibration_runs_among(artifact, [tiny_runs["dev"], tmp_path / "elsewhere"]) == [str(tiny_runs["dev"])]
    report = run_evaluate(tiny_artifact, _source(tiny_runs, tmp_path), tmp_path / "report", resamples=0)
    assert report["calibration_runs_evaluated"] == [str(tiny_runs["dev"])]
    assert any("partly in sample" in record.getMessage() for record in caplog.records)


def test_no_best_baseline_is_named_where_no_prr_is_defined(tiny_runs: dict[str, Path], tiny_artifact: Path) -> None:
    """Every answer right: no ranking to judge, so no baseline is best, and the report still renders."""
    from dataclasses import replace

    from app.uncertainty.artifact import load_artifact
    from training.evaluation import build_report
    from training.runs import iter_texts

    right = [replace(t, meta={**t.meta, "target": 1.0}) for t in iter_texts([tiny_runs["dev"]])]
    report, _ = build_report(load_artifact(tiny_artifact), right, resamples=20)
    for entry in report["datasets"].values():
        assert entry["default_vs_best_baseline"]["best_baseline"] is None
        assert entry["default_vs_best_baseline"]["difference"] is None
    assert "none defined" in report_markdown(report)
