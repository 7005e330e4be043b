"""Whether a prompt and its answer fit in the model's context, and with them P(True)'s check prompt.

A refusal names the field the client can change: the answer's length when the client set it, else the prompt
(a default length gives way to the room left, as vLLM's does)."""

from __future__ import annotations

from app.engine.engine import Engine
from app.errors import InvalidRequest
from app.serving.check_pass import CHECK_PROMPT_NAME, check_pass
from app.serving.tokenizing import tokenized


def context_length(engine: Engine) -> int | None:
    """The longest prompt plus answer: the model's context, or a compiled step's slot when that is shorter."""
    context: int | None = getattr(engine.loaded.model.config, "max_position_embeddings", None)
    if engine.compiled_decode_refusal() is None:
        slot = engine.compiled_decode_length - 1  # the answer's last token is fed once more, for its own row
        context = slot if context is None else min(context, slot)
    return context


def check_context(
    engine: Engine,
    prompt_tokens: int,
    answer_tokens: int,
    field: str,
    prompt_field: str | None = None,
) -> None:
    """`prompt_field`: the request's field for the prompt, named when the prompt alone leaves no room for an
    answer (no answer length could). P(True)'s check prompt is fitted by `fit_check_pass`."""
    context = context_length(engine)
    if context is None:
        return
    if prompt_field is not None and answer_tokens and prompt_tokens >= context:
        raise InvalidRequest(
            f"the prompt ({prompt_tokens} tokens) leaves no room for an answer in the model's maximum context "
            f"length of {context} tokens",
            param=prompt_field,
        )
    if prompt_tokens + answer_tokens > context:
        added = f" plus {field} ({answer_tokens})" if answer_tokens else ""
        raise InvalidRequest(
            f"prompt ({prompt_tokens} tokens){added} exceeds the model's maximum context length of {context} tokens",
            param=field,
        )


async def fit_check_pass(
    engine: Engine, question: str, prompt_field: str, answer_tokens: int, field: str, asked: bool
) -> int:
    """The answer tokens P(True)'s check prompt about `question` leaves room for in the context: all
    `answer_tokens` if they fit, else the room when the client set no length (`asked` False: a default gives
    way), else a refusal naming `field`; a question that leaves no room is refused naming the prompt."""
    context = context_length(engine)
    if context is None:
        return answer_tokens
    check_ids, _ = await tokenized(len(question), engine, check_pass, question, "")
    room = context - len(check_ids) - 1
    if room < 1:
        raise InvalidRequest(
            f"{CHECK_PROMPT_NAME} ({len(check_ids) + 1} tokens before the answer) leaves no room for an answer in "
            f"the model's maximum context length of {context} tokens: shorten the prompt",
            param=prompt_field,
        )
    if answer_tokens <= room or not asked:
        return min(answer_tokens, room)
    raise InvalidRequest(
        f"{CHECK_PROMPT_NAME} plus {field} ({answer_tokens} tokens) exceeds the model's maximum context length: "
        f"at most {room} tokens of answer fit with this prompt",
        param=field,
    )
