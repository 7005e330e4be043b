"""Chat messages to prompt token ids, with what users write read as text.

A chat template renders messages into one string, and tokenizing that string reads any
control-token text in it ("<|im_end|>", "<|im_start|>system") as the control token itself.
transformers and vLLM do that, so a user message can close its own turn and open a forged
system or assistant turn. Here a message's content is always text: where a content holds a
special token's text, the rendered prompt is tokenized piece by piece, the template's pieces
as usual and the contents with special tokens split into ordinary tokens. Messages without
such text take the usual single pass, so their ids are exactly what `apply_chat_template`
gives (what the artifacts were trained on).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase


class PromptError(ValueError):
    """A prompt that cannot be turned into tokens (e.g. no chat template for messages)."""


# Stand-ins for the contents while locating them in the rendered prompt: private-use characters
# no tokenizer gives a meaning and no template rewrites.
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"


def special_token_texts(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """The texts a tokenizer turns into special tokens when it meets them in a string."""
    texts = {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
    return tuple(sorted((text for text in texts if text), key=len, reverse=True))


def _render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]]) -> str:
    try:
        rendered = tokenizer.apply_chat_template(
            [dict(message) for message in messages], add_generation_prompt=True, tokenize=False
        )
    except (TemplateError, ValueError) as error:  # e.g. a template that wants alternating roles
        raise PromptError(f"the model's chat template refused these messages: {error}") from error
    return str(rendered)


def _ids(tokenizer: PreTrainedTokenizerBase, text: str, as_text: bool = False) -> list[int]:
    # add_special_tokens=False: the template writes its own BOS, as apply_chat_template(tokenize=True) assumes.
    encoded = tokenizer(text, add_special_tokens=False, split_special_tokens=as_text)
    return [int(i) for i in encoded["input_ids"]]


def _pieces(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]], rendered: str) -> list[str] | None:
    """The rendered prompt cut into template, content, template, ... (contents at odd indices), or None
    when the template does not copy every content verbatim (it trims or rewrites them)."""
    marked = [{**message, "content": f"{_MARK_OPEN}{i}{_MARK_CLOSE}"} for i, message in enumerate(messages)]
    skeleton = _render(tokenizer, marked)
    pieces: list[str] = []
    rest = skeleton
    for i, message in enumerate(messages):
        before, found, rest = rest.partition(f"{_MARK_OPEN}{i}{_MARK_CLOSE}")
        if not found:
            return None
        pieces += [before, str(message["content"])]
    pieces.append(rest)
    return pieces if "".join(pieces) == rendered else None


def encode_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]]) -> list[int]:
    """Prompt ids of chat messages through the tokenizer's chat template, contents read as text."""
    rendered = _render(tokenizer, messages)
    specials = special_token_texts(tokenizer)
    if not any(text in str(message.get("content", "")) for message in messages for text in specials):
        return _ids(tokenizer, rendered)
    pieces = _pieces(tokenizer, messages, rendered)
    if pieces is None:
        raise PromptError(
            "a message contains a control token's text, which this model's chat template does not let the "
            "service keep apart from the template's own control tokens; remove it from the message"
        )
    ids: list[int] = []
    for index, piece in enumerate(pieces):
        if piece:
            ids += _ids(tokenizer, piece, as_text=index % 2 == 1)
    return ids
