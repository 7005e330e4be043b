"""generate -> fit -> calibrate -> evaluate through the CLI, on the tiny model and a handful of records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.uncertainty.aggregation import Aggregation
from app.uncertainty.artifact import load_artifact
from app.uncertainty.methods import BASELINES
from training.cli import main
from training.fit.report import read_cv_record


def test_full_cycle_through_the_cli(tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]]) -> None:
    run, artifact, report = tmp_path / "run", tmp_path / "artifact", tmp_path / "report"
    common = ["--model", str(tiny_model_dir), "--max-new-tokens", "8", "--cache-dir", str(tmp_path / "cache")]
    main(["generate", "--data", *map(str, tiny_data["train"]), "--out", str(run), "--n-lags", "3", *common])
    main(["fit", str(run), "--out", str(artifact), "--alphas", "1", "0.01"])
    main(
        [
            "calibrate",
            "--artifact",
            str(artifact),
            "--data",
            *map(str, tiny_data["dev"]),
            "--coverage",
            "0.5",
            "--error",
            "0.95",
            "--delta",
            "0.2",
            "--run-dir",
            str(tmp_path / "dev-run"),
            *common,
        ]
    )
    main(["evaluate", "--artifact", str(artifact), "--run", str(tmp_path / "dev-run"), "--out", str(report)])

    loaded = load_artifact(artifact)
    manifest = loaded.manifest
    assert manifest.features.n_lags == 3 and manifest.training["texts"] == 48
    record = read_cv_record(artifact, manifest)  # report/cv.json
    grid = record["grid"]
    variants = ("leak-free", "algorithm1-literal", "authors")
    assert {(row["variant"], row["alpha_stage1"], row["alpha"], row["aggregation"]) for row in grid} == {
        (v, a1, a2, g) for v in variants for a1 in (1.0, 0.01) for a2 in (1.0, 0.01) for g in Aggregation
    }
    assert all(len(row["prr_folds"]) == 5 for row in grid)
    best = record["best_per_variant"]
    assert set(best) == set(variants) and manifest.variant in best
    for other in set(variants) - {manifest.variant}:
        assert (artifact / manifest.metrics["alternatives"][other]["file"]).is_file()
    conventions = record["conventions"]
    assert set(conventions) == {"generating", "consuming"}
    assert manifest.features.convention.value == record["convention"]
    assert "coverage@0.5" in manifest.thresholds["tad"] and manifest.default_target is not None

    data = json.loads((report / "report.json").read_text())
    assert set(data["datasets"]) == {"squad", "mmlu"}
    assert data["overall"]["n"] == sum(entry["n"] for entry in data["datasets"].values())
    for entry in [*data["datasets"].values(), data["overall"]]:
        assert entry["n"] > 0 and 0 <= entry["accuracy"] <= 1
        assert {"tad", "msp", "perplexity", "mean_token_entropy"} <= set(entry["methods"])
        for scores in entry["methods"].values():
            assert set(scores) == {"prr", "prr_ci95", "roc_auc"}
            if scores["prr"] is not None and scores["prr_ci95"] is not None:
                low, high = scores["prr_ci95"]
                assert low <= high
        versus = entry["default_vs_best_baseline"]
        defined = {
            m.value for m in BASELINES if m.value in entry["methods"] and entry["methods"][m.value]["prr"] is not None
        }
        assert versus["default"] == "tad"
        # none where every answer is alike (no ranking to judge), else one with a PRR
        assert versus["best_baseline"] in defined if defined else versus["best_baseline"] is None
    informative = [n for n, e in data["datasets"].items() if e["accuracy"] is not None and 0.1 <= e["accuracy"] <= 0.9]
    assert data["informative_datasets"] == informative
    if informative:
        mean = data["mean_default_minus_best_baseline_informative"]
        differences = [data["datasets"][n]["default_vs_best_baseline"]["difference"] for n in informative]
        assert mean == pytest.approx(sum(differences) / len(differences))
        low, high = data["mean_default_minus_best_baseline_informative_ci95"]
        assert low <= high
    markdown = (report / "report.md").read_text()
    assert markdown.startswith("PRR at 50% rejection") and "ROC-AUC:" in markdown
    # PRR, ROC-AUC, default minus best baseline, the default policy's outcome
    assert markdown.count("| squad |") == 4
    assert (report / "rejection_squad.png").stat().st_size > 1000


def test_runs_made_when_chat_was_called_bare_are_read_with_new_ones(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """fit, calibrate, evaluate, lodo and summary on old and new chat-style runs together: one style."""
    from tests.training.test_runs import restyled

    train = [
        str(restyled(tiny_runs["train"], tmp_path / "train-old", "bare", shards=[0, 1])),
        str(restyled(tiny_runs["train"], tmp_path / "train-new", "chat", shards=[2])),
    ]
    dev = [
        str(restyled(tiny_runs["dev"], tmp_path / "dev-old", "bare", shards=[0])),
        str(restyled(tiny_runs["dev"], tmp_path / "dev-new", "chat", shards=[1])),
    ]
    artifact = tmp_path / "artifact"
    quick = ["--alphas", "1", "--variants", "leak-free", "--centrings", "none"]
    main(["fit", *train, "--out", str(artifact), *quick])
    assert load_artifact(artifact).manifest.training["texts"] == 48
    main(["calibrate", "--artifact", str(artifact), "--run", *dev, "--coverage", "0.5", "--error", "0.9"])
    main(
        ["evaluate", "--artifact", str(artifact), "--run", *dev, "--out", str(tmp_path / "report"), "--bootstrap", "0"]
    )
    assert json.loads((tmp_path / "report" / "report.json").read_text())["overall"]["n"] == 32
    main(
        [
            "lodo",
            *train,
            "--test",
            *dev,
            "--artifact",
            str(artifact),
            "--out",
            str(tmp_path / "lodo"),
            "--bootstrap",
            "0",
        ]
    )
    assert {e["n"] for e in json.loads((tmp_path / "lodo" / "lodo.json").read_text())["datasets"].values()} == {16}
    capsys.readouterr()
    main(["summary", *dev])
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [(row.split("|")[1].strip(), row.split("|")[2].strip()) for row in rows] == [("mmlu", "16"), ("squad", "16")]


def test_help_on_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ([], ["generate"], ["fit"], ["evaluate"], ["calibrate"], ["lodo"], ["summary"]):
        with pytest.raises(SystemExit) as stop:
            main([*command, "--help"])
        assert stop.value.code == 0
        assert "usage:" in capsys.readouterr().out


def test_summary_lists_each_dataset(tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    main(["summary", str(tiny_runs["dev"])])
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| dataset | texts | accuracy")
    assert [row.split("|")[1].strip() for row in table[2:]] == ["mmlu", "squad"]
    assert all(row.split("|")[2].strip() == "16" for row in table[2:])


def test_summary_names_the_informative_datasets(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import shutil

    main(["summary", "--informative", str(tiny_runs["dev"])])
    assert capsys.readouterr().out == "\n"  # the random tiny model gets nothing right
    run = tmp_path / "labelled"
    shutil.copytree(tiny_runs["dev"], run)
    for texts_file in run.glob("shards/*/texts.json"):
        texts = json.loads(texts_file.read_text())
        for index, text in enumerate(texts):
            text["target"] = float(index % 2 if text["dataset"] == "squad" else 1)  # squad half right, mmlu all
        texts_file.write_text(json.dumps(texts))
    main(["summary", "--informative", str(run)])
    assert capsys.readouterr().out == "squad\n"
