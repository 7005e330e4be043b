"""Resolving a request's reject policy: a method that cannot decide is refused, never silently ungated."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from app.errors import InvalidRequest
from app.serving.policy import Policy, PolicyRequest, decide, policy_choices, resolve_policy
from app.settings import RejectAction, Settings
from app.uncertainty.artifact import Threshold
from app.uncertainty.methods import Method, SequenceUncertainty


def _artifact(
    thresholds: dict[Method, list[str]], regressor: bool = True, decision: Method = Method.TAD
) -> SimpleNamespace:
    """What resolve_policy reads of an artifact: its calibrated thresholds, default target, regressor."""
    entry = Threshold(threshold=0.5, kind="error", target=0.7, coverage=0.3, error=0.6, n=100)
    manifest = SimpleNamespace(
        thresholds={method: dict.fromkeys(targets, entry) for method, targets in thresholds.items()},
        default_target="error@0.7",
    )
    return SimpleNamespace(manifest=manifest, decision_method=decision, has_regressor=regressor, name="fake")


ARTIFACT = _artifact(
    {Method.TAD: ["error@0.7"], Method.MSP: ["error@0.7", "coverage@0.5"], Method.RAUQ: ["coverage@0.5"]}
)
CALIBRATION_ONLY = _artifact({Method.RAUQ: ["error@0.7"]}, regressor=False, decision=Method.RAUQ)


def test_a_named_method_gets_its_own_threshold_for_the_services_target() -> None:
    policy = resolve_policy(Settings(), ARTIFACT, PolicyRequest(method=Method.MSP))  # type: ignore[arg-type]
    assert policy.method is Method.MSP and policy.threshold == 0.5 and policy.name == "calibrated:error@0.7"


def test_a_named_method_without_a_threshold_for_the_target_is_refused_not_ungated() -> None:
    with pytest.raises(InvalidRequest) as refused:
        resolve_policy(Settings(), ARTIFACT, PolicyRequest(method=Method.RAUQ))  # type: ignore[arg-type]
    assert refused.value.param == "policy.method"
    assert "error@0.7" in str(refused.value) and "coverage@0.5" in str(refused.value)
    # With a target it has, or a threshold, it decides.
    by_target = resolve_policy(Settings(), ARTIFACT, PolicyRequest(method=Method.RAUQ, target="coverage@0.5"))  # type: ignore[arg-type]
    assert by_target.threshold == 0.5
    assert resolve_policy(Settings(), ARTIFACT, PolicyRequest(method=Method.RAUQ, threshold=2.0)).threshold == 2.0  # type: ignore[arg-type]


def test_a_target_without_an_artifact_says_there_is_none_to_calibrate_it() -> None:
    with pytest.raises(InvalidRequest, match=r"no artifact is loaded: send policy.threshold") as refused:
        resolve_policy(Settings(), None, PolicyRequest(method=Method.MSP, target="error@0.5"))
    assert refused.value.param == "policy.target"


def test_a_service_that_does_not_gate_leaves_a_named_method_ungated_too() -> None:
    settings = Settings(reject_target=None)
    policy = resolve_policy(settings, ARTIFACT, PolicyRequest(method=Method.RAUQ))  # type: ignore[arg-type]
    assert policy.threshold is None and policy.name == "none"


@pytest.mark.parametrize(
    ("artifact", "method", "reason"),
    [
        (None, Method.TAD, "no TAD artifact"),
        (CALIBRATION_ONLY, Method.TAD, "calibration-only"),
    ],
)
def test_a_method_the_service_cannot_compute_is_refused(artifact: object, method: Method, reason: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        resolve_policy(Settings(), artifact, PolicyRequest(method=method, threshold=1.0))  # type: ignore[arg-type]
    assert refused.value.param == "policy.method" and reason in str(refused.value)


@pytest.mark.parametrize("method", [Method.RAUQ, Method.ATTENTION_SCORE, Method.MSP])
def test_without_an_artifact_the_attention_methods_decide_too(method: Method) -> None:
    policy = resolve_policy(Settings(), None, PolicyRequest(method=method, threshold=1.0))
    assert policy.method is method and policy.threshold == 1.0


def test_a_calibration_only_artifact_decides_with_its_method_and_threshold() -> None:
    policy = resolve_policy(Settings(), CALIBRATION_ONLY, None)  # type: ignore[arg-type]
    assert policy.method is Method.RAUQ and policy.threshold == 0.5 and policy.name == "calibrated:error@0.7"


def test_without_an_artifact_a_probability_baseline_still_decides() -> None:
    policy = resolve_policy(Settings(), None, PolicyRequest(method=Method.MSP, threshold=1.0))
    assert policy.method is Method.MSP and policy.threshold == 1.0


def test_without_an_artifact_naming_the_fallback_method_gets_the_fallback_policy() -> None:
    assert resolve_policy(Settings(), None, PolicyRequest(method=Method.PERPLEXITY)).name == "fallback:none"
    gated = Settings(fallback_threshold=0.4)
    policy = resolve_policy(gated, None, PolicyRequest(method=Method.PERPLEXITY))
    assert policy.threshold == 0.4 and policy.name == "fallback:fixed"
    with pytest.raises(InvalidRequest) as refused:  # the service gates; MSP has no threshold to gate with
        resolve_policy(gated, None, PolicyRequest(method=Method.MSP))
    assert "policy.threshold" in str(refused.value) and "policy.target" not in str(refused.value)


def test_a_fixed_service_threshold_is_not_offered_to_another_method() -> None:
    settings = Settings(reject_target=None, reject_method=Method.TAD, reject_threshold=0.8)
    with pytest.raises(InvalidRequest) as refused:
        resolve_policy(settings, ARTIFACT, PolicyRequest(method=Method.MSP))  # type: ignore[arg-type]
    assert "belongs to its method tad" in str(refused.value) and "None" not in str(refused.value)


def test_an_artifact_without_a_default_target_leaves_named_methods_ungated_as_the_service() -> None:
    artifact = _artifact({Method.MSP: ["coverage@0.5"]})
    artifact.manifest.default_target = None
    assert resolve_policy(Settings(), artifact, None).threshold is None  # type: ignore[arg-type]
    assert resolve_policy(Settings(), artifact, PolicyRequest(method=Method.MSP)).name == "none"  # type: ignore[arg-type]


def test_policy_choices_state_what_resolve_policy_refuses() -> None:
    with_artifact = policy_choices(Settings(), ARTIFACT)  # type: ignore[arg-type]
    assert with_artifact.refused == ()
    # Calibrated for the service's target (error@0.7): TAD and MSP; every other method needs its own.
    assert Method.RAUQ in with_artifact.need_threshold and Method.PERPLEXITY in with_artifact.need_threshold
    assert Method.TAD not in with_artifact.need_threshold and Method.MSP not in with_artifact.need_threshold
    assert not with_artifact.threshold_needs_method

    without = policy_choices(Settings(), None)
    assert without.refused == (Method.TAD,)
    assert Method.MSP not in without.refused and without.need_threshold == ()
    assert without.threshold_needs_method  # the service's own method (TAD) cannot decide without an artifact


@pytest.mark.parametrize(
    ("configured", "requested", "expected"),
    [
        (RejectAction.FLAG, None, RejectAction.FLAG),
        (RejectAction.WITHHOLD, None, RejectAction.WITHHOLD),
        (RejectAction.WITHHOLD, RejectAction.FLAG, RejectAction.FLAG),
        (RejectAction.FLAG, RejectAction.WITHHOLD, RejectAction.WITHHOLD),
    ],
)
def test_the_action_is_the_requests_else_the_services(
    configured: RejectAction, requested: RejectAction | None, expected: RejectAction
) -> None:
    settings = Settings(reject_action=configured)
    for request in (PolicyRequest(action=requested), PolicyRequest(method=Method.MSP, threshold=1.0, action=requested)):
        policy = resolve_policy(settings, ARTIFACT, request)  # type: ignore[arg-type]
        assert policy.action is expected
    # The action changes nothing about who decides and against what.
    assert replace(resolve_policy(settings, ARTIFACT, PolicyRequest(action=requested)), action=RejectAction.FLAG) == (  # type: ignore[arg-type]
        replace(resolve_policy(Settings(), ARTIFACT, None), action=RejectAction.FLAG)  # type: ignore[arg-type]
    )


def test_only_a_rejected_generated_answer_is_withheld() -> None:
    withhold = Policy(method=Method.MSP, threshold=1.0, name="fixed", action=RejectAction.WITHHOLD)
    low, high = SequenceUncertainty({Method.MSP: 0.5}), SequenceUncertainty({Method.MSP: 2.0})
    assert decide(withhold, high, generated=True).withheld
    assert not decide(withhold, high).withheld  # a scored answer is the caller's own
    assert not decide(withhold, low, generated=True).withheld
    assert decide(withhold, SequenceUncertainty({}), generated=True).withheld  # no score (empty answer): rejected
    assert not decide(replace(withhold, action=RejectAction.FLAG), high, generated=True).withheld


@pytest.mark.parametrize("field", ["reject_threshold", "fallback_threshold"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_threshold_setting_must_be_finite(monkeypatch: pytest.MonkeyPatch, field: str, value: str) -> None:
    monkeypatch.setenv(f"TAD_{field.upper()}", value)
    with pytest.raises(ValidationError, match=field):
        Settings()
