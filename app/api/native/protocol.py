"""Request and response models of the native API (/v1/generate, /v1/score).

The OpenAPI schema states what validation enforces: a prompt or messages (exactly one,
never null), text that is not blank, non-empty lists.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from app.api.common import (
    MAX_TEXT_CHARS,
    NOT_BLANK,
    DecisionInfo,
    LogprobCount,
    PolicyOverride,
    PositiveInt,
    Seed,
    SequenceScores,
    StopStrings,
    StrictModel,
    is_blank,
)
from app.serving.outcomes import PromptInput as DomainPrompt

MAX_MESSAGES = 256
ATTENTION_DOC = (
    "per token, the attention row TAD reads (to its N previous answer tokens), averaged over layers and heads; "
    "null without a TAD artifact"
)
_EXPLICIT_NULL = object()


class ChatMessage(StrictModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_TEXT_CHARS)


def _never_null(schema: dict[str, Any]) -> None:
    """The field may be left out but never sent as null (validation refuses it): drop null from its schema."""
    branches = [branch for branch in schema.pop("anyOf", []) if branch.get("type") != "null"]
    if len(branches) == 1:
        schema.update(branches[0])
    schema.pop("default", None)
    if "items" in schema:
        schema["contains"] = {"properties": {"content": {"pattern": NOT_BLANK}}}


ONE_PROMPT: dict[str, Any] = {"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]}


def _details_without_tokens(field: str, value: dict[str, Any], unless_streamed: bool) -> dict[str, Any]:
    """The schema of a request asking for a token detail (`field`: `value`) in a response without tokens
    (`unless_streamed`: a streamed request is not one, its token events carry the detail)."""
    properties: dict[str, Any] = {"return_tokens": {"const": False}, field: value}
    if unless_streamed:
        properties["stream"] = {"const": False}
    return {"required": ["return_tokens", field], "properties": properties}


class PromptFields(StrictModel):
    """Exactly one of `prompt` (raw text, no chat template) or `messages` (chat template applied)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=ONE_PROMPT)

    prompt: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_TEXT_CHARS,
        pattern=NOT_BLANK,
        description="raw prompt text, sent to the model as is (not blank)",
        json_schema_extra=_never_null,
    )
    messages: list[ChatMessage] | None = Field(
        None,
        min_length=1,
        max_length=MAX_MESSAGES,
        validate_default=True,
        description="chat messages; the model's chat template is applied (at least one with text)",
        json_schema_extra=_never_null,
    )

    @model_validator(mode="before")
    @classmethod
    def _mark_explicit_nulls(cls, data: Any) -> Any:
        # A missing field and an explicit null look alike to field validators: mark the null.
        if isinstance(data, dict) and any(data.get(name, ...) is None for name in ("prompt", "messages")):
            return {
                key: _EXPLICIT_NULL if value is None and key in ("prompt", "messages") else value
                for key, value in data.items()
            }
        return data

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_not_blank(cls, value: Any) -> Any:
        if value is _EXPLICIT_NULL:
            raise ValueError("prompt must not be null; send prompt or messages")
        if isinstance(value, str) and is_blank(value):
            raise ValueError("prompt must not be empty")
        return value

    @field_validator("messages", mode="before")
    @classmethod
    def _messages_with_text(cls, value: Any) -> Any:
        if value is _EXPLICIT_NULL:
            raise ValueError("messages must not be null; send prompt or messages")
        if isinstance(value, list):
            if not value:
                raise ValueError("messages must not be empty")
            contents = [m.get("content") if isinstance(m, dict) else getattr(m, "content", None) for m in value]
            texts = [c for c in contents if isinstance(c, str)]
            if len(texts) == len(contents) and all(is_blank(c) for c in texts):
                raise ValueError("messages must contain some text")
        return value

    @field_validator("messages")
    @classmethod
    def _exactly_one(cls, value: list[ChatMessage] | None, info: ValidationInfo) -> list[ChatMessage] | None:
        has_prompt = info.data.get("prompt") is not None
        if value is not None and has_prompt:
            raise ValueError("give either prompt or messages, not both")
        if value is None and not has_prompt and "prompt" in info.data:
            raise ValueError("one of prompt or messages is required")
        return value

    def to_prompt(self) -> DomainPrompt:
        messages = [m.model_dump() for m in self.messages] if self.messages is not None else None
        return DomainPrompt(prompt=self.prompt, messages=messages)


_Detail = TypeVar("_Detail", int, bool)


def _carried_by_tokens(value: _Detail, info: ValidationInfo, streamed: bool) -> _Detail:
    """Top log-probs and attention rows travel with each token: a response without its tokens would drop
    them silently (a stream still sends them, in its token events)."""
    if value and not streamed and info.data.get("return_tokens") is False:
        raise ValueError(f"{info.field_name} is carried by each token: it needs return_tokens true")
    return value


class GenerateRequest(PromptFields):
    # Validation refuses token details in a response without tokens (unless streamed): so does the schema.
    model_config = ConfigDict(
        json_schema_extra={
            **ONE_PROMPT,
            "allOf": [
                {"not": _details_without_tokens("top_logprobs", {"minimum": 1}, unless_streamed=True)},
                {"not": _details_without_tokens("return_attention", {"const": True}, unless_streamed=True)},
            ],
        }
    )

    max_new_tokens: PositiveInt | None = Field(None, description="1..the service's limit (default: its default)")
    temperature: float = Field(0.0, ge=0.0, le=2.0, allow_inf_nan=False, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: Seed | None = Field(None, description="for sampling; echoed in the response")
    stop: StopStrings = Field(None, description="stop strings (not included in the text)")

    stream: bool = Field(False, description="server-sent events: one per token, then a final event")
    return_tokens: bool = Field(
        True, description="include per-token details (with `stream`, only the final event goes without them)"
    )
    top_logprobs: LogprobCount = Field(
        0, description="list this many most likely tokens at each step with each token (at most the service's limit)"
    )
    return_attention: bool = Field(False, description=ATTENTION_DOC)
    policy: PolicyOverride | None = None
    early_stop: bool = Field(
        False, description="abort generation once the running uncertainty crosses the reject threshold"
    )

    @field_validator("top_logprobs", "return_attention")
    @classmethod
    def _needs_tokens(cls, value: int | bool, info: ValidationInfo) -> int | bool:
        return _carried_by_tokens(value, info, streamed=bool(info.data.get("stream")))


class ScoreRequest(PromptFields):
    model_config = ConfigDict(
        json_schema_extra={
            **ONE_PROMPT,
            "not": _details_without_tokens("return_attention", {"const": True}, unless_streamed=False),
        }
    )

    response: str = Field(
        min_length=1, max_length=MAX_TEXT_CHARS, pattern=NOT_BLANK, description="the answer to score (not blank)"
    )
    return_tokens: bool = Field(True, description="include per-token details")
    return_attention: bool = Field(False, description=ATTENTION_DOC)
    policy: PolicyOverride | None = None

    @field_validator("return_attention")
    @classmethod
    def _needs_tokens(cls, value: bool, info: ValidationInfo) -> bool:
        return _carried_by_tokens(value, info, streamed=False)

    @field_validator("response", mode="before")
    @classmethod
    def _response_not_blank(cls, value: Any) -> Any:
        if isinstance(value, str) and is_blank(value):
            raise ValueError("response must not be blank")
        return value


TOKEN_BYTES_DOC = (
    "the token's exact UTF-8 bytes: a character split over several tokens joins back from them "
    "(its part shows as U+FFFD in `text`)"
)


class TopLogprob(BaseModel):
    id: int
    text: str
    bytes: list[int] = Field(description=TOKEN_BYTES_DOC)
    logprob: float = Field(description="log-probability under the model's raw logits")


class TokenInfo(BaseModel):
    id: int
    text: str = Field(
        description="the token's text; in a stream's token events, the piece it adds to the answer's text "
        "(empty while it holds part of a character)"
    )
    bytes: list[int] = Field(description=TOKEN_BYTES_DOC)
    logprob: float = Field(description="log-probability under the model's raw logits")
    entropy: float = Field(description="entropy of the full next-token distribution")
    confidence: float | None = Field(description="TAD token confidence c_i (null without TAD)")
    uncertainty: float | None = Field(description="1 - confidence")
    top_logprobs: list[TopLogprob] | None = Field(
        None, description="the most likely tokens at this step, most likely first (null unless requested)"
    )
    attention: list[float | None] | None = Field(
        None,
        description="with return_attention: entry l-1 is this token's attention to the token l back (l = 1..N), "
        "mean over layers and heads, as TAD's features read it; null entries reach before the answer; "
        "null for the first token, which reads none",
    )


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
    text: str = Field(description="the answer; when `decision.withheld`, the service's withheld message instead")
    finish_reason: Literal["stop", "length", "uncertainty"]
    seed: int | None


class TokenEvent(TokenInfo):
    """Streamed as `event: token`; `index` is the token's position in the answer."""

    index: int
