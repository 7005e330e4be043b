"""The default score's gap to the best baseline when the targets carry no signal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.best_baseline_null import gap_to_best, main, null_gap
from training.rejection import prediction_rejection_ratio


def test_the_gap_is_the_default_prr_minus_the_largest_baseline_prr() -> None:
    rng = np.random.default_rng(0)
    targets = (rng.uniform(size=200) < 0.4).astype(float)
    scores = {name: rng.normal(size=200) - targets * weight for name, weight in (("d", 1.0), ("a", 0.5), ("b", 2.0))}
    expected = prediction_rejection_ratio(scores["d"], targets) - prediction_rejection_ratio(scores["b"], targets)
    assert gap_to_best(scores, targets, "d", ["a", "b"]) == pytest.approx(expected)


def test_with_no_signal_the_best_of_several_baselines_leads_by_construction() -> None:
    # Five scores of the same kind and no signal: shuffling the targets, the default is behind the best
    # of the other four on average, and behind by more the more baselines there are to pick from.
    rng = np.random.default_rng(1)
    targets = (rng.uniform(size=300) < 0.3).astype(float)
    scores = {name: rng.normal(size=300) for name in "dabcx"}
    one = null_gap(scores, targets, "d", ["a"], shuffles=300)
    four = null_gap(scores, targets, "d", ["a", "b", "c", "x"], shuffles=300)
    assert abs(one.null.mean()) < 2 * one.null.std() / np.sqrt(300)  # one baseline: no lead either way
    assert four.null.mean() < -2 * four.null.std() / np.sqrt(300)
    assert four.within_tolerance() < one.within_tolerance()
    # The observed gap uses the real targets; the same seed draws the same shuffles.
    assert four.observed == pytest.approx(gap_to_best(scores, targets, "d", ["a", "b", "c", "x"]))
    np.testing.assert_array_equal(four.null, null_gap(scores, targets, "d", ["a", "b", "c", "x"], shuffles=300).null)


def test_prints_one_row_per_dataset(
    tiny_artifact: Path, tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    main(["--artifact", str(tiny_artifact), "--run", str(tiny_runs["dev"]), "--shuffles", "5"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) >= 2 and rows[0].startswith("| dataset |")


def test_refuses_a_dataset_the_runs_do_not_hold(tiny_artifact: Path, tiny_runs: dict[str, Path]) -> None:
    with pytest.raises(SystemExit):
        main(["--artifact", str(tiny_artifact), "--run", str(tiny_runs["dev"]), "--datasets", "no-such-dataset"])
