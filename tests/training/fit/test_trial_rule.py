"""The trial rule: a significant fold-paired gain that costs the other ranking nothing significant."""

from __future__ import annotations

import pytest

from training.fit.cross_validation import ConventionResult
from training.fit.trial_rule import keep_by_trial_rule, paired_gain, trial_verdict
from training.groups import Selection, TargetCentring


def test_a_gain_inside_the_fold_noise_is_not_significant() -> None:
    assert not paired_gain([0.50, 0.61, 0.42, 0.55, 0.47], [0.52, 0.58, 0.44, 0.51, 0.48])["significant"]
    assert paired_gain([0.55, 0.62, 0.47, 0.58, 0.51], [0.50, 0.58, 0.44, 0.52, 0.48])["significant"]


def _row(within_group: list[float], pooled: list[float], selection: str = "within-group") -> dict[str, object]:
    selected = within_group if selection == "within-group" else pooled
    return {
        "prr_mean": sum(selected) / len(selected),
        "prr_folds": selected,
        "within_group_prr_folds": within_group,
        "pooled_prr_folds": pooled,
    }


def test_a_trial_is_kept_on_a_significant_gain_that_costs_the_other_ranking_nothing_significant() -> None:
    base = _row([0.20, 0.25, 0.22, 0.18, 0.24], [0.60, 0.66, 0.62, 0.64, 0.61])
    better = _row([0.28, 0.31, 0.27, 0.25, 0.30], [0.61, 0.64, 0.63, 0.62, 0.62])
    verdict = trial_verdict(better, base, Selection.WITHIN_GROUP)
    assert verdict["kept"] and verdict["gain"]["significant"] and verdict["other_metric"] == "pooled"
    # The same within-group gain bought with the pooled ranking (what target centring does): refused.
    bought = _row([0.28, 0.31, 0.27, 0.25, 0.30], [0.20, 0.22, 0.18, 0.21, 0.19])
    verdict = trial_verdict(bought, base, Selection.WITHIN_GROUP)
    assert verdict["gain"]["significant"] and not verdict["kept"]
    assert verdict["other_loss_significant"] and verdict["other_change"]["mean"] == pytest.approx(-0.426)
    # Selecting by pooled PRR, the guard looks at the within-group ranking instead.
    pooled_base = _row([0.28, 0.31, 0.27, 0.25, 0.30], [0.60, 0.66, 0.62, 0.64, 0.61], "pooled")
    pooled_better = _row([0.20, 0.25, 0.22, 0.18, 0.24], [0.68, 0.72, 0.69, 0.71, 0.68], "pooled")
    verdict = trial_verdict(pooled_better, pooled_base, Selection.POOLED)
    assert verdict["gain"]["significant"] and verdict["other_metric"] == "within-group" and not verdict["kept"]
    # No significant gain: not kept, whatever the other metric does.
    assert not trial_verdict(base, base, Selection.WITHIN_GROUP)["kept"]


def _result(row: dict[str, object], centring: TargetCentring) -> ConventionResult:
    return ConventionResult(
        spec=None,  # type: ignore[arg-type]  # the rule reads only the chosen row and the selection
        folds=lambda: None,  # type: ignore[arg-type,return-value]
        table=[],
        best={},
        chosen_row=row,
        baselines={},
        selection=Selection.WITHIN_GROUP,
        centring=centring,
    )


def test_each_trial_is_judged_against_the_one_kept_so_far() -> None:
    pooled = [0.60, 0.66, 0.62, 0.64, 0.61]
    rows = {
        TargetCentring.NONE: _row([0.20, 0.25, 0.22, 0.18, 0.24], pooled),
        TargetCentring.GROUP_QUARTER: _row([0.28, 0.31, 0.27, 0.25, 0.30], pooled),
        # Significantly better than raw targets, but not than the quarter kept before it.
        TargetCentring.GROUP_HALF: _row([0.30, 0.30, 0.28, 0.26, 0.30], pooled),
        TargetCentring.GROUP: _row([0.20, 0.24, 0.22, 0.19, 0.24], pooled),
    }
    assert trial_verdict(rows[TargetCentring.GROUP_HALF], rows[TargetCentring.NONE], Selection.WITHIN_GROUP)["kept"]
    tried: list[TargetCentring] = []

    def cross_validate(centring: TargetCentring) -> ConventionResult:
        tried.append(centring)
        return _result(rows[centring], centring)

    alternatives = (TargetCentring.GROUP_QUARTER, TargetCentring.GROUP_HALF, TargetCentring.GROUP)
    kept, record = keep_by_trial_rule(
        _result(rows[TargetCentring.NONE], TargetCentring.NONE), "none", alternatives, cross_validate
    )
    assert tried == list(alternatives)
    assert kept.centring is TargetCentring.GROUP_QUARTER
    assert [record[c.value]["kept"] for c in alternatives] == [True, False, False]
    assert record["group-0.5"]["gain"]["mean"] == pytest.approx(0.006)
