"""OpenAI-compatible request/response models (chat completions, completions, models).

Responses carry one extension field, `uncertainty`: the sequence scores, per-token
confidences and the accept/reject decision. Requests may carry `tad` options.
Known OpenAI options this service cannot honour are refused (400, as OpenAI answers) naming them,
rather than silently ignored.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from app.api.common import (
    MAX_TEXT_CHARS,
    NOT_BLANK,
    DecisionInfo,
    LogprobCount,
    OnlyOne,
    OpenAISeed,
    PolicyOverride,
    PositiveInt,
    SequenceScores,
    StopStrings,
    StrictModel,
    TokenConfidence,
    is_blank,
)


class TadOptions(StrictModel):
    """Extension: the reject policy and early stopping for this request."""

    policy: PolicyOverride | None = None
    early_stop: bool = False


class StreamOptions(StrictModel):
    include_usage: bool = False


COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


# Text parts in one message's content: refused whole beyond this, before each part is validated.
MAX_CONTENT_PARTS = 1024


class TextPart(StrictModel):
    type: Literal["text"]
    text: str = Field(max_length=MAX_TEXT_CHARS)


class TextFormat(StrictModel):
    type: Literal["text"]


class OpenAIMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | Annotated[list[TextPart], Field(max_length=MAX_CONTENT_PARTS)] = Field(max_length=MAX_TEXT_CHARS)
    name: str | None = Field(None, max_length=256)
    # A previous response's message sent back as it was dumped (`message.model_dump()`) carries these as
    # null; anything else in them (a tool call, audio) is not something this service can take.
    refusal: None = None
    tool_calls: None = None
    function_call: None = None
    audio: None = None
    annotations: None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        # Separate parts are separate pieces of text: vLLM (and TensorRT-LLM's OpenAI server) join them
        # with a newline, so the same request gives the same prompt there and here.
        return "\n".join(part.text for part in self.content)


MAX_MODEL_NAME = 256  # characters; a longer one is no model's name, and error messages repeat it

# What the schema says of checks across fields (validation enforces the same; design.md).
STREAM_OPTIONS_NEED_STREAM: dict[str, Any] = {
    "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
}
TOP_LOGPROBS_NEED_LOGPROBS: dict[str, Any] = {
    "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer", "minimum": 1}}},
    "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
}


def only_one(value: object, refusal: str) -> object:
    """`value` unless it asks for more than one (refused with `refusal`: the bound's own "less than or equal
    to 1" does not say the option is unsupported)."""
    if type(value) is int and value > 1:
        raise ValueError(refusal)
    return value


class _SamplingFields(StrictModel):
    model: str = Field(min_length=1, max_length=MAX_MODEL_NAME)
    temperature: float | None = Field(
        None, ge=0.0, le=2.0, allow_inf_nan=False, description="default 1.0, as in the OpenAI API"
    )
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    # OpenAI's API takes null for these as "not set"; so do these routes.
    n: OnlyOne | None = Field(1, description="only 1 is supported")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: StopStrings = None
    seed: OpenAISeed | None = None
    presence_penalty: float | None = Field(
        0.0, ge=0.0, le=0.0, allow_inf_nan=False, description="not supported (must be 0)"
    )
    frequency_penalty: float | None = Field(
        0.0, ge=0.0, le=0.0, allow_inf_nan=False, description="not supported (must be 0)"
    )
    logit_bias: dict[str, float] | None = Field(
        None, description="not supported (must be empty)", json_schema_extra={"maxProperties": 0}
    )
    user: str | None = None
    tad: TadOptions | None = None

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        # OpenAI's API (and vLLM) refuse it too: the options would be silently ignored.
        # A `stream` that failed its own validation is not in info.data: its error is the one to report.
        if value is not None and "stream" in info.data and not info.data["stream"]:
            raise ValueError("stream_options is only allowed with stream: true")
        return value

    @field_validator("n", mode="before")
    @classmethod
    def _one_choice(cls, value: object) -> object:
        return only_one(value, "only one choice per request is supported (n = 1)")

    @field_validator("presence_penalty", "frequency_penalty", mode="before")
    @classmethod
    def _no_penalty(cls, value: object) -> object:
        # A NaN is left to the bounds, which say it should be finite.
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value != 0:
            raise ValueError("not supported: send 0 or leave it out")
        return value

    # Before its values are validated: refused whole, a large map costs nothing to refuse.
    @field_validator("logit_bias", mode="before")
    @classmethod
    def _no_bias(cls, value: object) -> object:
        if isinstance(value, dict) and value:
            raise ValueError("logit_bias is not supported")
        return value

    @property
    def effective_temperature(self) -> float:
        return 1.0 if self.temperature is None else self.temperature

    @property
    def effective_top_p(self) -> float:
        return 1.0 if self.top_p is None else self.top_p


class ChatCompletionRequest(_SamplingFields):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        # Validation: top_logprobs > 0 needs logprobs: true, stream_options needs stream: true.
        json_schema_extra={"allOf": [TOP_LOGPROBS_NEED_LOGPROBS, STREAM_OPTIONS_NEED_STREAM]},
    )

    messages: list[OpenAIMessage] = Field(
        min_length=1,
        max_length=256,
        description="at least one message with text",
        json_schema_extra={
            "contains": {
                "properties": {
                    "content": {
                        "anyOf": [
                            {"type": "string", "pattern": NOT_BLANK},
                            {"type": "array", "contains": {"properties": {"text": {"pattern": NOT_BLANK}}}},
                        ]
                    }
                }
            }
        },
    )
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = False
    top_logprobs: LogprobCount | None = None
    # Accepted because here they change nothing: the answer is text, no tool is offered, nothing is stored.
    # Values that would change something (a JSON format, a tool choice, storing) are refused.
    response_format: TextFormat | None = Field(None, description="only {'type': 'text'}")
    tool_choice: Literal["none"] | None = Field(None, description="only 'none' (no tools are offered)")
    parallel_tool_calls: bool | None = None
    store: Literal[False] | None = Field(None, description="nothing is stored (must be false)")
    metadata: dict[str, str] | None = Field(None, max_length=16)
    # Hints and identifiers a framework may send, and the defaults of features this service lacks: null, or the
    # one value that asks for nothing (a text answer, no function).
    prompt_cache_key: str | None = Field(None, max_length=1024, description="accepted and unused")
    safety_identifier: str | None = Field(None, max_length=1024, description="accepted and unused")
    modalities: list[Literal["text"]] | None = Field(None, max_length=1, description="only ['text']")
    function_call: Literal["none"] | None = Field(None, description="only 'none' (no functions are offered)")
    audio: None = Field(None, description="not supported (must be null)")
    prediction: None = Field(None, description="not supported (must be null)")

    @field_validator("store", mode="before")
    @classmethod
    def _store_is_a_boolean(cls, value: object) -> object:
        # pydantic matches Literal[False] by equality even in strict mode, so 0 and 0.0 would pass as false.
        if value is not None and type(value) is not bool:
            raise ValueError("must be false or null")
        return value

    # Field validators, not a model one, so that a refusal's `param` names the field (a model validator's
    # errors are located at the body). `logprobs` is declared before `top_logprobs`: its value is in `info.data`.
    @field_validator("messages")
    @classmethod
    def _some_text(cls, messages: list[OpenAIMessage]) -> list[OpenAIMessage]:
        if all(is_blank(m.text()) for m in messages):
            raise ValueError("messages must contain some text")
        return messages

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, top_logprobs: int | None, info: ValidationInfo) -> int | None:
        if top_logprobs and "logprobs" in info.data and not info.data["logprobs"]:
            raise ValueError("top_logprobs requires logprobs: true")
        return top_logprobs


# The schema's limit on each prompt in the list: the field's own max_length counts a list's items, not its text.
PromptText = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]


class CompletionRequest(_SamplingFields):
    model_config = ConfigDict(json_schema_extra={"allOf": [STREAM_OPTIONS_NEED_STREAM]})

    prompt: str | list[PromptText] = Field(
        max_length=MAX_TEXT_CHARS,
        description="one prompt (a string, or a list holding one string), not blank",
        json_schema_extra={
            "anyOf": [
                {"type": "string", "minLength": 1, "maxLength": MAX_TEXT_CHARS, "pattern": NOT_BLANK},
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 1,
                    "items": {"type": "string", "minLength": 1, "maxLength": MAX_TEXT_CHARS, "pattern": NOT_BLANK},
                },
            ]
        },
    )
    max_tokens: PositiveInt | None = Field(
        None,
        description=f"default {COMPLETIONS_DEFAULT_MAX_TOKENS}, as in the OpenAI API (less where the context ends)",
    )
    logprobs: LogprobCount | None = None
    # Null means not set, as for every other optional field.
    echo: bool | None = Field(
        False, description="not supported (must be false)", json_schema_extra={"enum": [False, None]}
    )
    best_of: OnlyOne | None = None
    suffix: None = None

    @field_validator("best_of", mode="before")
    @classmethod
    def _one_candidate(cls, value: object) -> object:
        return only_one(value, "not supported: one answer is generated (best_of = 1)")

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("echo is not supported")
        return value

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt_listed(cls, value: object) -> object:
        """Before the items are validated: a list of many prompts is refused whole, token ids by name."""
        if isinstance(value, list) and value and all(isinstance(item, int) for item in value):
            raise ValueError("token ids are not supported: send the prompt as text")
        if isinstance(value, list) and len(value) != 1:
            raise ValueError("exactly one prompt is supported")
        return value

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, value: str | list[str]) -> str:
        prompts = [value] if isinstance(value, str) else value
        if len(prompts) != 1:
            raise ValueError("exactly one prompt is supported")
        if is_blank(prompts[0]):
            raise ValueError("prompt must not be empty")
        return prompts[0]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class IndexedConfidence(TokenConfidence):
    index: int


class UncertaintyExtension(BaseModel):
    """This service's addition to the OpenAI shapes."""

    sequence: SequenceScores | None = None
    tokens: list[IndexedConfidence] | None = None
    decision: DecisionInfo | None = None
    finish_reason: str | None = Field(
        None, description="how generation ended: stop, length, or uncertainty (early stop), withheld or not"
    )
    tad_available: bool | None = None


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChoiceLogprobs | None
    finish_reason: Literal["stop", "length", "content_filter"]


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    uncertainty: UncertaintyExtension


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length", "content_filter"]


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    uncertainty: UncertaintyExtension


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tad-serve"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
