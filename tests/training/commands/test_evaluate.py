"""`evaluate --compare-artifact`: another artifact's default score beside this one's, paired per dataset."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.engine.loading import LoadedModel
from app.engine.prompt_attention import prompt_statistic_names
from training.commands.evaluate import COMPARED_SCORE, report_markdown, run_evaluate
from training.commands.fit import FitOptions, run_fit
from training.run_source import RunSource
from training.runs import iter_texts, read_run_settings


def _source(tiny_runs: dict[str, Path], tmp_path: Path) -> RunSource:
    return RunSource(data=[], runs=[tiny_runs["dev"]], default_run_dir=tmp_path / "unused")


def test_the_compared_artifacts_score_and_the_paired_difference_are_reported(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    run_fit(FitOptions(runs=[tiny_runs["train"]], out=other, alphas=(100.0,), extra_feature_sets=(), combiner=False))
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


def test_runs_without_a_statistic_an_artifact_scores_with_are_refused_naming_the_option(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    with_entropy = tmp_path / "with-entropy"
    run_fit(
        FitOptions(
            runs=[tiny_runs["train"]],
            out=with_entropy,
            alphas=(1.0,),
            extra_stats=("entropy",),
            extra_feature_sets=(),
            combiner=False,
        )
    )
    report = run_evaluate(with_entropy, _source(tiny_runs, tmp_path), tmp_path / "report", 0, tiny_artifact)
    assert report["datasets"]
    stripped = tmp_path / "dev-without-entropy"
    shutil.copytree(tiny_runs["dev"], stripped)
    for shard_stat in stripped.glob("shards/*/stat-entropy.npy"):
        shard_stat.unlink()
    source = RunSource(data=[], runs=[stripped], default_run_dir=tmp_path / "unused")
    with pytest.raises(SystemExit, match=r"^--artifact: the runs hold no per-token statistic entropy"):
        run_evaluate(with_entropy, source, tmp_path / "r1", 0)
    with pytest.raises(SystemExit, match=r"^--compare-artifact: the runs hold no per-token statistic entropy"):
        run_evaluate(tiny_artifact, source, tmp_path / "r2", 0, with_entropy)
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_an_artifact_scoring_with_statistics_generation_does_not_record_is_refused_before_generating(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path
) -> None:
    from tests.artifacts import studied_artifact

    studied = studied_artifact(tiny_runs["train"], tmp_path, ("study_only",), tiny_artifact)
    data = tmp_path / "unused.jsonl"
    data.write_text("")
    source = RunSource(data=[data], runs=[], default_run_dir=tmp_path / "new-run")
    for artifact, compared in ((studied, None), (tiny_artifact, studied)):
        with pytest.raises(SystemExit, match=r"per-token statistics generation does not record \(1: study_only"):
            run_evaluate(artifact, source, tmp_path / "report", 0, compared)
    assert not (tmp_path / "new-run").exists()


def test_an_artifact_reading_the_attention_to_the_prompt_has_its_run_generated_with_it(
    tiny_runs: dict[str, Path],
    tiny_artifact: Path,
    tiny_data: dict[str, list[Path]],
    tiny_loaded: LoadedModel,
    tmp_path: Path,
) -> None:
    from tests.artifacts import studied_artifact

    layers, heads = tiny_loaded.identity.num_layers, tiny_loaded.identity.num_heads
    names = prompt_statistic_names(layers, heads)
    studied = studied_artifact(tiny_runs["train"], tmp_path, names, tiny_artifact)
    source = RunSource(data=tiny_data["dev"], runs=[], default_run_dir=tmp_path / "new-run", limit=4, max_new_tokens=6)
    report = run_evaluate(studied, source, tmp_path / "report", 20, tiny_artifact)
    assert report["compared_artifact"] == str(tiny_artifact)
    assert read_run_settings(tmp_path / "new-run")["prompt_attention"] is True
    assert set(names) <= set(next(iter_texts([tmp_path / "new-run"])).stats)


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
