"""The default score's gap to the best baseline when the targets carry no signal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.uncertainty.artifact import load_artifact
from benchmarks.best_baseline_null import gap_to_best, main, null_gap
from training.commands.evaluate import build_report
from training.rejection import prediction_rejection_ratio
from training.runs import iter_texts


def test_the_gap_is_the_default_prr_minus_the_largest_baseline_prr() -> None:
    rng = np.random.default_rng(0)
    targets = (rng.uniform(size=200) < 0.4).astype(float)
    weights = (("tad", 1.0), ("msp", 0.5), ("rauq", 2.0))
    scores = {name: rng.normal(size=200) - targets * weight for name, weight in weights}
    expected = prediction_rejection_ratio(scores["tad"], targets) - prediction_rejection_ratio(scores["rauq"], targets)
    assert gap_to_best(scores, targets, "tad", ["msp", "rauq"]) == pytest.approx(expected)


def test_with_no_signal_the_best_of_several_baselines_leads_by_construction() -> None:
    # Five scores of the same kind and no signal: shuffling the targets, the default is behind the best
    # of the other four on average, and behind by more the more baselines there are to pick from.
    rng = np.random.default_rng(1)
    targets = (rng.uniform(size=300) < 0.3).astype(float)
    four_baselines = ["msp", "perplexity", "rauq", "mean_token_entropy"]
    scores = {name: rng.normal(size=300) for name in ["tad", *four_baselines]}
    one = null_gap(scores, targets, "tad", ["msp"], shuffles=300)
    four = null_gap(scores, targets, "tad", four_baselines, shuffles=300)
    assert abs(one.null.mean()) < 2 * one.null.std() / np.sqrt(300)  # one baseline: no lead either way
    assert four.null.mean() < -2 * four.null.std() / np.sqrt(300)
    assert four.within_tolerance() < one.within_tolerance()
    # The observed gap uses the real targets; the same seed draws the same shuffles.
    assert four.observed == pytest.approx(gap_to_best(scores, targets, "tad", four_baselines))
    np.testing.assert_array_equal(four.null, null_gap(scores, targets, "tad", four_baselines, shuffles=300).null)


def test_the_observed_gap_is_the_one_evaluate_reports(
    tiny_artifact: Path, tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    texts = list(iter_texts([tiny_runs["dev"]]))
    report, _ = build_report(load_artifact(tiny_artifact), texts, resamples=10)
    datasets = sorted({t.dataset for t in texts})
    main(["--artifact", str(tiny_artifact), "--run", str(tiny_runs["dev"]), "--shuffles", "5", "--datasets", *datasets])
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert [row[1].strip() for row in rows] == datasets
    for row in rows:
        reported = report["datasets"][row[1].strip()]["default_vs_best_baseline"]["difference"]
        if reported is None:  # no PRR where every answer is wrong (or right)
            assert np.isnan(float(row[4]))
        else:
            assert float(row[4]) == pytest.approx(reported, abs=5e-4)  # printed to three decimals
    assert any(report["datasets"][d]["default_vs_best_baseline"]["difference"] is not None for d in datasets)


def test_refuses_a_dataset_the_runs_do_not_hold(tiny_artifact: Path, tiny_runs: dict[str, Path]) -> None:
    with pytest.raises(SystemExit):
        main(["--artifact", str(tiny_artifact), "--run", str(tiny_runs["dev"]), "--datasets", "no-such-dataset"])
