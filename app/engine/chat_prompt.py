"""Chat messages to prompt token ids, with what users write read as text.

A chat template renders messages into one string, and tokenizing that string reads any
control-token text in it ("<|im_end|>", "<|im_start|>system") as the control token itself, so
a user message could close its own turn and open a forged system or assistant turn. transformers
(since 5.20) can keep the two apart: with `sanitize_control_tokens` the control tokens inside
messages are encoded as ordinary text and only those the template writes stay control tokens.
Messages without such text get exactly the ids of a plain `apply_chat_template` (what the
artifacts were trained on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase


class PromptError(ValueError):
    """A prompt that cannot be turned into tokens (e.g. no chat template for messages)."""


def encode_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]]) -> list[int]:
    """Prompt ids of chat messages through the tokenizer's chat template, contents read as text."""
    try:
        encoded = tokenizer.apply_chat_template(
            [dict(message) for message in messages],
            add_generation_prompt=True,
            tokenize=True,
            sanitize_control_tokens=True,
        )
    # A template that refuses the messages (e.g. roles that must alternate), or control-token text
    # the tokenizer would rebuild from plain text anyway.
    except (TemplateError, ValueError) as error:
        # A template's own refusal (`raise_exception`, a TemplateError proper) and transformers' ValueErrors are
        # written for the sender; any other template error is the template's internals, not for a client.
        told = type(error) is TemplateError or not isinstance(error, TemplateError)
        reason = f": {error}" if told else ""
        raise PromptError(f"the model's chat template refused these messages{reason}") from error
    # A BatchEncoding, or the ids themselves, depending on the transformers version.
    ids: Any = encoded["input_ids"] if hasattr(encoded, "keys") else encoded  # type: ignore[call-overload,index]
    return [int(i) for i in ids]
