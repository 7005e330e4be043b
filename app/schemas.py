"""Request and response models of the native API (/v1/generate, /v1/score, ops routes)."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from app.uncertainty.scores import Method

MAX_SEED = 2**63 - 1
# Longer texts cannot fit the prompt-token limit anyway; keeping them under the body limit
# means an over-long field is a 422 naming it, not a 413.
MAX_TEXT_CHARS = 200_000


def stop_list(value: str | list[str] | None) -> list[str] | None:
    """`stop` as a list; empty strings are refused (they would stop at once)."""
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if any(not stop for stop in stops):
        raise ValueError("stop strings must not be empty")
    return stops


def check_stop_lengths(value: object) -> object:
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    if any(isinstance(stop, str) and len(stop) > 1000 for stop in items):
        raise ValueError("stop strings must be at most 1000 characters")
    return value


# Stop strings as a field type, shared by the native and the OpenAI-compatible requests.
StopStrings = Annotated[str | list[str] | None, BeforeValidator(check_stop_lengths), AfterValidator(stop_list)]


class StrictModel(BaseModel):
    """Requests reject unknown fields, so a typo is an error rather than a silent default."""

    model_config = ConfigDict(extra="forbid")


class ChatMessage(StrictModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_TEXT_CHARS)


class PolicyOverride(StrictModel):
    """Overrides the service's reject policy for one request: a fixed threshold or a calibrated target."""

    method: Method | None = Field(None, description="whose sequence uncertainty is compared (default: the service's)")
    threshold: float | None = Field(None, description="reject when uncertainty > threshold")
    target: str | None = Field(None, description="a target the artifact calibrated, e.g. 'error@0.3', 'coverage@0.8'")

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


class PromptInput(StrictModel):
    """Exactly one of `prompt` (raw text, no chat template) or `messages` (chat template applied)."""

    prompt: str | None = Field(None, max_length=MAX_TEXT_CHARS, description="raw prompt text, sent to the model as is")
    messages: list[ChatMessage] | None = Field(
        None, validate_default=True, max_length=256, description="chat messages; the model's chat template is applied"
    )

    @field_validator("prompt")
    @classmethod
    def _prompt_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("prompt must not be empty")
        return value

    @field_validator("messages")
    @classmethod
    def _exactly_one(cls, value: list[ChatMessage] | None, info: ValidationInfo) -> list[ChatMessage] | None:
        has_prompt = info.data.get("prompt") is not None
        if value is not None and has_prompt:
            raise ValueError("give either prompt or messages, not both")
        if value is None and not has_prompt and "prompt" in info.data:
            raise ValueError("one of prompt or messages is required")
        if value is not None:
            if not value:
                raise ValueError("messages must not be empty")
            if not any(m.content.strip() for m in value):
                raise ValueError("messages must contain some text")
        return value


class GenerateRequest(PromptInput):
    max_new_tokens: int | None = Field(None, ge=1, description="1..the service's limit (default: its default)")
    temperature: float = Field(0.0, ge=0.0, le=2.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="for sampling; echoed in the response")
    stop: StopStrings = Field(None, description="stop strings (not included in the text)")

    return_tokens: bool = Field(True, description="include per-token details")
    stream: bool = Field(False, description="server-sent events: one per token, then a final event")
    policy: PolicyOverride | None = None
    early_stop: bool = Field(
        False, description="abort generation once the running uncertainty crosses the reject threshold"
    )


class ScoreRequest(PromptInput):
    response: str = Field(min_length=1, max_length=MAX_TEXT_CHARS, description="the answer to score")
    return_tokens: bool = True
    policy: PolicyOverride | None = None


class TokenInfo(BaseModel):
    id: int
    text: str
    logprob: float = Field(description="log-probability under the model's raw logits")
    entropy: float = Field(description="entropy of the full next-token distribution")
    confidence: float | None = Field(description="TAD token confidence c_i (null without TAD)")
    uncertainty: float | None = Field(description="1 - confidence")


class SequenceScores(BaseModel):
    """Sequence uncertainty per method; higher means less trustworthy; null when undefined."""

    tad: float | None
    msp: float | None
    perplexity: float | None
    mean_token_entropy: float | None


class DecisionInfo(BaseModel):
    accept: bool
    method: Method
    score: float | None
    threshold: float | None
    policy: str = Field(description="fixed, calibrated:<target>, fallback:..., or none")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class ScoreResponse(BaseModel):
    tokens: list[TokenInfo] | None
    uncertainty: SequenceScores
    decision: DecisionInfo
    usage: Usage
    model: str
    artifact: str | None
    tad_available: bool


class GenerateResponse(ScoreResponse):
    text: str
    finish_reason: Literal["stop", "length", "uncertainty"]
    seed: int | None


class TokenEvent(TokenInfo):
    """Streamed as `event: token`; `index` is the token's position in the answer."""

    index: int


class HealthResponse(BaseModel):
    status: Literal["ok"]


class ReadyResponse(BaseModel):
    status: Literal["ready"]
    model: str
    artifact: str | None


class InfoResponse(BaseModel):
    model: dict[str, Any]
    device: str
    dtype: str
    tad_available: bool
    tad_unavailable_reason: str | None
    artifact: dict[str, Any] | None
    policy: dict[str, Any]
    limits: dict[str, Any]
    version: str
