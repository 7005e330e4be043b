"""Reject policy: which method's uncertainty is compared with which threshold, the decision, and early stop."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from app.errors import InvalidRequest
from app.settings import RejectAction, Settings
from app.uncertainty.artifact import TadArtifact
from app.uncertainty.methods import REGISTRY, Method, SequenceUncertainty

# Early stop waits for this many scored tokens: a running score over one or two tokens says little.
EARLY_STOP_MIN_TOKENS = 4


@dataclass(frozen=True)
class PolicyRequest:
    """What one request asks of the policy (every field optional): a method, a threshold or a target, and
    what to do with a rejected answer."""

    method: Method | None = None
    threshold: float | None = None
    target: str | None = None
    action: RejectAction | None = None


@dataclass(frozen=True)
class Policy:
    method: Method
    threshold: float | None  # None: no threshold could be resolved; only an answer without a score is rejected
    name: str
    action: RejectAction = RejectAction.FLAG

    def as_dict(self) -> dict[str, object]:
        return {"method": self.method.value, "threshold": self.threshold, "policy": self.name, "action": self.action}

    @property
    def needs_regressor(self) -> bool:
        return REGISTRY[self.method.value].needs_regressor

    def stops_early(self, running: float | None, scored_tokens: int) -> bool:
        """Whether an answer still being generated should be cut off now (it will be rejected).

        For sums and minima (MSP, sum-log and min TAD) the running score only grows, so the answer
        would have been rejected anyway; for means this is a heuristic.
        """
        if self.threshold is None or running is None or scored_tokens < EARLY_STOP_MIN_TOKENS:
            return False
        return not math.isnan(running) and running > self.threshold


@dataclass(frozen=True)
class Decision:
    accept: bool
    method: Method
    score: float | None
    threshold: float | None
    policy: str
    withheld: bool = False  # rejected under the withhold action: its text was not returned


def _target_name(artifact: TadArtifact | None, target: str) -> str | None:
    """A target as settings and requests name it: 'default' reads as the artifact's default target."""
    if target != "default":
        return target
    return artifact.manifest.default_target if artifact is not None else None


def _calibrated(artifact: TadArtifact | None, method: Method, target: str) -> Policy | None:
    name = _target_name(artifact, target)
    if artifact is None or name is None:
        return None
    entry = artifact.manifest.thresholds.get(method, {}).get(name)
    if entry is None:
        return None
    return Policy(method=method, threshold=entry.threshold, name=f"calibrated:{name}")


def configured_target(settings: Settings, artifact: TadArtifact | None) -> str | None:
    """The calibrated target a method without a threshold of its own is decided at (TAD_REJECT_TARGET, with
    'default' read as the artifact's), as `_resolve_threshold` reads it; None when there is none."""
    return None if settings.reject_target is None else _target_name(artifact, settings.reject_target)


def default_method(settings: Settings, artifact: TadArtifact | None) -> Method:
    """The method decisions use unless a request names one: the settings', else the artifact's decision method."""
    if settings.reject_method is not None:
        return settings.reject_method
    return artifact.decision_method if artifact is not None else Method("tad")


def resolve_policy(settings: Settings, artifact: TadArtifact | None, override: PolicyRequest | None) -> Policy:
    """The effective policy for one request: its override if any, else the service's settings."""
    action = override.action if override is not None and override.action is not None else settings.reject_action
    return replace(_resolve_threshold(settings, artifact, override), action=action)


def _resolve_threshold(settings: Settings, artifact: TadArtifact | None, override: PolicyRequest | None) -> Policy:
    """Which method decides and against which threshold.

    A fixed threshold from the settings belongs to the settings' method only; a request that
    names another method gets that method's calibrated threshold (or none). A request that
    asks for TAD explicitly while no artifact is loaded is refused rather than silently
    answered with another method.
    """
    configured = default_method(settings, artifact)
    method = override.method if override and override.method else configured
    unavailable = _unavailable(method, artifact)
    if unavailable is not None:
        if override is not None and (
            override.method is method or override.threshold is not None or override.target is not None
        ):
            raise InvalidRequest(
                f"{method.value} is unavailable ({unavailable}); name another method in policy.method",
                param="policy.method",
            )
        return _fallback(settings)
    if override is not None and override.threshold is not None:
        return Policy(method=method, threshold=override.threshold, name="fixed")
    if override is not None and override.target is not None:
        resolved = _calibrated(artifact, method, override.target)
        if resolved is None:
            known = sorted(artifact.manifest.thresholds.get(method, {})) if artifact else []
            raise InvalidRequest(
                f"no calibrated threshold '{override.target}' for method {method.value}"
                + (
                    f" (available: {', '.join(known)})"
                    if known
                    else " (the artifact has none)"
                    if artifact
                    else " (no artifact is loaded: send policy.threshold)"
                ),
                param="policy.target",
            )
        return resolved
    if settings.reject_threshold is not None and method is configured:
        return Policy(method=method, threshold=settings.reject_threshold, name="fixed")
    if settings.reject_target is not None:
        resolved = _calibrated(artifact, method, settings.reject_target)
        if resolved is not None:
            return resolved
    if _unavailable(configured, artifact) is not None and method is settings.fallback_method:
        return _fallback(settings)  # what the service itself decides with, named by the request
    if override is not None and override.method is not None and method is not configured:
        # A method the request chose that cannot be gated while the service gates would accept everything.
        service = resolve_policy(settings, artifact, None)
        if service.threshold is not None:
            raise InvalidRequest(_no_threshold_message(method, artifact, service), param="policy.method")
    return Policy(method=method, threshold=None, name="none")


@dataclass(frozen=True)
class PolicyChoices:
    """What a request's policy may name in this service (the deployment's schema states it)."""

    refused: tuple[Method, ...]  # methods that cannot decide here, whatever comes with them
    need_threshold: tuple[Method, ...]  # methods that decide only with a threshold or target of their own
    threshold_needs_method: bool  # a bare threshold is refused: the service's own method cannot decide


def policy_choices(settings: Settings, artifact: TadArtifact | None) -> PolicyChoices:
    """Ask `resolve_policy` itself, so that the schema and validation cannot disagree."""

    def resolves(request: PolicyRequest) -> bool:
        try:
            resolve_policy(settings, artifact, request)
        except InvalidRequest:
            return False
        return True

    refused, need_threshold = [], []
    for method in Method:
        if not resolves(PolicyRequest(method=method, threshold=0.0)):
            refused.append(method)
        elif not resolves(PolicyRequest(method=method)):
            need_threshold.append(method)
    return PolicyChoices(
        refused=tuple(refused),
        need_threshold=tuple(need_threshold),
        threshold_needs_method=not resolves(PolicyRequest(threshold=0.0)),
    )


def _no_threshold_message(method: Method, artifact: TadArtifact | None, service: Policy) -> str:
    if artifact is None:
        return f"method {method.value} has no threshold here (no TAD artifact is loaded); send policy.threshold"
    if service.name.startswith("calibrated:"):
        target = service.name.removeprefix("calibrated:")
        known = sorted(artifact.manifest.thresholds.get(method, {}))
        return (
            f"method {method.value} has no calibrated threshold for the service's target '{target}'; "
            "send policy.threshold or policy.target" + (f" (calibrated: {', '.join(known)})" if known else "")
        )
    return (
        f"the service's threshold belongs to its method {service.method.value}; "
        f"for {method.value} send policy.threshold or policy.target"
    )


def _unavailable(method: Method, artifact: TadArtifact | None) -> str | None:
    """Why a method cannot score answers in this service, or None if it can."""
    spec = REGISTRY[method.value]
    if spec.needs_regressor and artifact is None:
        return "no TAD artifact is loaded"
    if spec.needs_regressor and artifact is not None and not artifact.has_regressor:
        return f"artifact {artifact.name} is calibration-only (it has no TAD regressor)"
    return None


def _fallback(settings: Settings) -> Policy:
    method = settings.fallback_method
    if settings.fallback_threshold is not None:
        return Policy(method=method, threshold=settings.fallback_threshold, name="fallback:fixed")
    return Policy(method=method, threshold=None, name="fallback:none")


def decide(policy: Policy, sequence: SequenceUncertainty, generated: bool = False) -> Decision:
    """Reject when the score exceeds the threshold; an answer with no score (empty) is rejected.

    `generated`: the answer is one this service generated, so the withhold action applies to it (a
    scored answer is the caller's own: there is nothing to withhold).
    """
    score = sequence.get(policy.method)
    if score is not None and math.isnan(score):
        score = None
    accept = score is not None and (policy.threshold is None or score <= policy.threshold)
    return Decision(
        accept=accept,
        method=policy.method,
        score=score,
        threshold=policy.threshold,
        policy=policy.name,
        withheld=generated and not accept and policy.action is RejectAction.WITHHOLD,
    )
