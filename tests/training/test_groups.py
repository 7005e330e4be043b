"""Groups of training texts: centring keeps rankings within a group; the within-group metric averages groups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from training.groups import (
    TargetCentring,
    centred,
    informative_groups,
    within_group_prr,
)
from training.rejection import prediction_rejection_ratio
from training.two_stage import FitText


def _text(group: str, target: float) -> FitText:
    dataset = group.split("/")[0]
    empty = np.zeros(0)
    return FitText(
        key=f"{group}/{target}",
        dataset=dataset,
        target=target,
        stats={},
        probs=empty,
        attention=empty,
        group=group,
    )


def _texts() -> list[FitText]:
    easy = [_text("squad/task", t) for t in (1.0, 1.0, 1.0, 0.0, 1.0, 0.0)]  # accuracy 4/6
    hard = [_text("gsm8k/task", t) for t in (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)]  # never right
    mixed = [_text("mmlu/chat", t) for t in (0.0, 1.0, 0.0, 1.0, 0.0, 0.0)]  # accuracy 2/6
    return easy + hard + mixed


def test_centring_gives_every_group_the_overall_mean_and_keeps_the_measured_target() -> None:
    texts = _texts()
    overall = np.mean([t.target for t in texts])
    result = centred(texts, TargetCentring.GROUP)
    for group in {t.group for t in texts}:
        members = [t for t in result if t.group == group]
        assert np.mean([t.training_target for t in members]) == pytest.approx(overall)
    assert [t.target for t in result] == [t.target for t in texts]
    # A shift per group: within a group, training targets keep their order and spacing.
    squad = [t for t in result if t.group == "squad/task"]
    assert len({round(t.target - t.training_target, 12) for t in squad}) == 1
    assert all(t.offset == 0.0 for t in centred(result, TargetCentring.NONE))


@pytest.mark.parametrize("centring", [TargetCentring.GROUP_QUARTER, TargetCentring.GROUP_HALF])
def test_partial_centring_moves_each_group_that_share_of_the_way_to_the_overall_mean(
    centring: TargetCentring,
) -> None:
    texts = _texts()
    overall = np.mean([t.target for t in texts])
    full = {t.key: t.offset for t in centred(texts, TargetCentring.GROUP)}
    result = centred(texts, centring)
    for text in result:
        assert text.offset == pytest.approx(centring.strength * full[text.key])
    for group in {t.group for t in texts}:
        raw = np.mean([t.target for t in texts if t.group == group])
        trained = np.mean([t.training_target for t in result if t.group == group])
        assert trained == pytest.approx(raw + centring.strength * (overall - raw))


def test_centrings_are_tried_from_none_to_full() -> None:
    assert [c.strength for c in TargetCentring] == [0.0, 0.25, 0.5, 1.0]


def test_informative_groups_are_those_with_accuracy_between_a_tenth_and_nine_tenths() -> None:
    assert informative_groups(_texts()) == frozenset({"squad/task", "mmlu/chat"})


def test_within_group_prr_is_the_mean_over_the_informative_groups_only() -> None:
    texts = _texts()
    rng = np.random.default_rng(0)
    scores = rng.normal(size=len(texts))
    groups = informative_groups(texts)
    expected = np.mean(
        [
            prediction_rejection_ratio(
                scores[[i for i, t in enumerate(texts) if t.group == g]],
                np.array([t.target for t in texts if t.group == g]),
            )
            for g in sorted(groups)
        ]
    )
    assert within_group_prr(scores, texts, groups) == pytest.approx(expected)
    # Ranking the groups apart (all of GSM8K most uncertain) earns pooled PRR, not within-group PRR.
    by_group = np.array([{"squad/task": 0.0, "mmlu/chat": 0.5, "gsm8k/task": 1.0}[t.group] for t in texts])
    assert prediction_rejection_ratio(by_group, np.array([t.target for t in texts])) > 0.3
    assert within_group_prr(by_group, texts, groups) == pytest.approx(0.0, abs=1e-12)


def test_fit_cross_validates_centring_and_records_its_choice(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    from app.uncertainty.artifact import load_artifact
    from training.fit.options import FitOptions
    from training.fit.pipeline import run_fit
    from training.fit.report import read_cv_record

    manifest = run_fit(FitOptions(runs=[tiny_runs["train"]], out=tmp_path / "a", alphas=(1.0,)))
    cv = read_cv_record(tmp_path / "a", manifest)
    assert list(cv["centrings"]) == [c.value for c in TargetCentring]
    kept_so_far = "none"
    for centring in list(TargetCentring)[1:]:  # each tried against the one kept before it
        trial = cv["centrings"][centring.value]
        assert {"gain", "other_metric", "other_change", "other_loss_significant", "kept"} <= set(trial)
        assert trial["other_metric"] != cv["selection_metric"]
        assert trial["kept"] == (
            trial["gain"]["significant"]
            and trial["prr_mean"] > cv["centrings"][kept_so_far]["prr_mean"]
            and not trial["other_loss_significant"]
        )
        if trial["kept"]:
            kept_so_far = centring.value
    assert manifest.regressor.params["target_centring"] == cv["target_centring"] == kept_so_far
    row = cv["chosen"]
    assert {"pooled_prr_mean", "within_group_prr_mean"} <= set(row)
    metric = "within_group_prr_mean" if cv["selection_metric"] == "within-group" else "pooled_prr_mean"
    assert row["prr_mean"] == pytest.approx(row[metric], nan_ok=True)
    assert load_artifact(tmp_path / "a").manifest.regressor.params["target_centring"] == cv["target_centring"]
