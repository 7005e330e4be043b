"""The made-up-premise benchmark decides as the service does: with the default policy's method, TAD's own
threshold beside it where the default is another score, and MSP at each one's coverage."""

from __future__ import annotations

from pathlib import Path

from app.serving.policy import resolve_policy
from app.settings import Settings
from app.uncertainty.artifact import load_artifact
from app.uncertainty.methods import Method
from benchmarks.false_premises import rules_of


def test_a_trained_artifact_is_compared_with_msp_at_the_same_coverage(tiny_artifact: Path) -> None:
    artifact = load_artifact(tiny_artifact)
    policy = resolve_policy(Settings(artifact_dir=tiny_artifact), artifact, None)
    rules = rules_of(artifact.manifest, policy)
    assert rules[0].method is policy.method and rules[0].threshold == policy.threshold
    assert any(rule.method is Method("msp") for rule in rules[1:])


def test_a_calibration_only_artifact_decides_with_its_own_method(tiny_calibration_artifact: Path) -> None:
    artifact = load_artifact(tiny_calibration_artifact)
    policy = resolve_policy(Settings(artifact_dir=tiny_calibration_artifact), artifact, None)
    rules = rules_of(artifact.manifest, policy)
    assert rules[0].method is artifact.decision_method
    assert all(rule.method is not Method("tad") for rule in rules)


def test_an_artifact_deciding_with_p_true_is_compared_with_msp_at_its_coverage(tiny_p_true_artifact: Path) -> None:
    artifact = load_artifact(tiny_p_true_artifact)
    policy = resolve_policy(Settings(artifact_dir=tiny_p_true_artifact), artifact, None)
    rules = rules_of(artifact.manifest, policy)
    assert rules[0].method is Method("p_true") and rules[0].threshold == policy.threshold
    assert [rule.method for rule in rules[1:]] == [Method("msp")]
