"""Protocol pieces both APIs share: strict requests, stop strings, the policy override, scores, decisions."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    create_model,
    field_validator,
    model_validator,
)

from app.numeric import finite_or_none
from app.serving.policy import Decision, PolicyRequest
from app.settings import RejectAction
from app.uncertainty.methods import METHODS, Method, SequenceUncertainty

# What the formatters read of the engine's tokenizer (`Engine.token_bytes`, `Engine.token_text`). A token's
# exact bytes are the `bytes` field, from which clients rebuild characters split over tokens.
TokenToBytes = Callable[[int], bytes]
TokenToText = Callable[[int], str]

# Every integer up to 2**53 is exact as a JSON number (a float), so a seed means one thing in any client.
MAX_SEED = 2**53
# Longer texts cannot fit the prompt-token limit anyway; keeping them under the body limit
# means an over-long field is a 422 naming it, not a 413.
MAX_TEXT_CHARS = 200_000
MAX_STOP_CHARS = 1000
# The most stop strings the schema takes (TAD_MAX_STOP_STRINGS, at most this, is the deployment's limit): a
# longer list is refused whole, before pydantic validates (and describes) each of its items.
MAX_STOP_STRINGS = 256
# A text field that must hold something other than whitespace, as validation and the schema both say.
# Python, JSON Schema (ECMA) and pydantic's (Rust) regexes disagree on a few whitespace characters;
# naming them makes the three agree.
NOT_BLANK = r"[^\s\x1c-\x1f\x85\ufeff]"


def is_blank(text: str) -> bool:
    return re.search(NOT_BLANK, text) is None


def _whole_number(value: object) -> object:
    # JSON Schema counts 5.0 as an integer; strict validation would not.
    return int(value) if isinstance(value, float) and value.is_integer() and abs(value) < 2**64 else value


# Integer fields: the constraint sits before the validator so that the schema states it (minimum, maximum).
PositiveInt = Annotated[int, Field(ge=1), BeforeValidator(_whole_number)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED), BeforeValidator(_whole_number)]
# OpenAI's API takes negative seeds too (the generator reads one as its two's complement); the same bound on
# their size as the native seed's: beyond 2**53 a JSON number is not one integer in every client (a JavaScript
# client sends -2**63 as -9223372036854776000, below the 64-bit range that OpenAI's schema states).
OpenAISeed = Annotated[int, Field(ge=-MAX_SEED, le=MAX_SEED), BeforeValidator(_whole_number)]
LogprobCount = Annotated[int, Field(ge=0, le=20), BeforeValidator(_whole_number)]
OnlyOne = Annotated[int, Field(ge=1, le=1), BeforeValidator(_whole_number)]


def stop_list(value: str | list[str] | None) -> list[str] | None:
    """`stop` as a list."""
    if value is None:
        return None
    return [value] if isinstance(value, str) else value


def check_stop_strings(value: object) -> object:
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    if any(isinstance(stop, str) and not stop for stop in items):
        raise ValueError("stop strings must not be empty")  # an empty stop string would stop at once
    if any(isinstance(stop, str) and len(stop) > MAX_STOP_CHARS for stop in items):
        raise ValueError(f"stop strings must be at most {MAX_STOP_CHARS} characters")
    return value


StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
# Stop strings as a field type, shared by the native and the OpenAI-compatible requests.
StopStrings = Annotated[
    StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None,
    BeforeValidator(check_stop_strings),
    AfterValidator(stop_list),
]


def _holds_lone_surrogate(value: object) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, list | tuple):
        return any(_holds_lone_surrogate(item) for item in value)
    return False


class StrictModel(BaseModel):
    """Requests reject unknown fields, so a typo is an error rather than a silent default."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*")
    @classmethod
    def _unicode_text(cls, value: object) -> object:
        # JSON may escape half of a surrogate pair ("\ud83d", a string cut inside an emoji); Python
        # parses it, but no tokenizer can encode it. Nested models check their own fields.
        if _holds_lone_surrogate(value):
            raise ValueError("text must be valid Unicode: it holds a lone surrogate (half of an emoji)")
        return value


class PolicyOverride(StrictModel):
    """Overrides the service's reject policy for one request: a fixed threshold or a calibrated target."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        # Validation refuses a threshold and a target together: so does the schema.
        json_schema_extra={
            "not": {
                "required": ["threshold", "target"],
                "properties": {"threshold": {"type": "number"}, "target": {"type": "string"}},
            }
        },
    )

    method: Method | None = Field(
        None, strict=False, description="whose sequence uncertainty is compared (default: the service's)"
    )
    threshold: float | None = Field(None, description="reject when uncertainty > threshold")
    target: str | None = Field(
        None, max_length=64, description="a target the artifact calibrated, e.g. 'error@0.3', 'coverage@0.8'"
    )
    action: RejectAction | None = Field(
        None,
        strict=False,
        description="what happens to a rejected answer (default: the service's): 'flag' returns it with its "
        "decision; 'withhold' returns the service's withheld message instead, and a stream sends no token "
        "before the decision",
    )

    @field_validator("threshold")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("threshold must be a finite number")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> PolicyOverride:
        if self.threshold is not None and self.target is not None:
            raise ValueError("give either threshold or target, not both")
        return self

    def to_request(self) -> PolicyRequest:
        return PolicyRequest(method=self.method, threshold=self.threshold, target=self.target, action=self.action)


def policy_request(override: PolicyOverride | None) -> PolicyRequest | None:
    return override.to_request() if override is not None else None


# Sequence uncertainty per method: one explicit (documented) field per registered method.
SequenceScores: type[BaseModel] = create_model(
    "SequenceScores",
    __doc__="Sequence uncertainty per method; higher means less trustworthy; null when undefined.",
    **{m.name: (float | None, Field(description=m.description)) for m in METHODS},  # type: ignore[call-overload]
)


def sequence_scores(values: SequenceUncertainty) -> BaseModel:
    return SequenceScores(**{m.name: finite_or_none(values.get(Method(m.name))) for m in METHODS})


class DecisionInfo(BaseModel):
    accept: bool
    method: Method
    score: float | None
    threshold: float | None
    policy: str = Field(description="fixed, calibrated:<target>, fallback:..., or none")
    withheld: bool = Field(
        description="the answer was rejected under the withhold action: the text is the service's withheld "
        "message and the answer's tokens are left out"
    )

    @classmethod
    def of(cls, decision: Decision) -> DecisionInfo:
        return cls(
            accept=decision.accept,
            method=decision.method,
            score=finite_or_none(decision.score),
            threshold=decision.threshold,
            policy=decision.policy,
            withheld=decision.withheld,
        )


class TokenConfidence(BaseModel):
    """TAD's confidence in one token, and its complement."""

    confidence: float | None = Field(description="TAD token confidence c_i (null without TAD)")
    uncertainty: float | None = Field(description="1 - confidence")

    @staticmethod
    def fields(confidence: float | None) -> dict[str, float | None]:
        """The two fields for a confidence (the one place that turns a confidence into an uncertainty)."""
        return {"confidence": confidence, "uncertainty": None if confidence is None else 1.0 - confidence}
