"""Tokenizing a request's text without stopping the event loop.

A text field may hold 200,000 characters, and a prompt is tokenized before its token count can be
refused. On the event loop that took 50-100 ms during which nothing else was answered: no stream's
next token, no disconnect check, no health probe (`benchmarks/tokenize_stall.py`). The tokenizer
releases the GIL, so a long text goes to a thread of its own; a short one costs less inline than the
thread hop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from app.serving.outcomes import PromptInput

TOKENIZE_INLINE_CHARS = 16_384
_TOKENIZER_THREAD = ThreadPoolExecutor(1, thread_name_prefix="tad-tokenize")

T = TypeVar("T")


def prompt_chars(prompt: PromptInput) -> int:
    """The characters of the prompt's text, its messages' contents together."""
    if prompt.messages is not None:
        return sum(len(str(m.get("content", ""))) for m in prompt.messages)
    return len(prompt.prompt or "")


async def tokenized(chars: int, tokenize: Callable[..., T], *args: object) -> T:
    """`tokenize(*args)`, off the event loop when its text (`chars` long) is long."""
    if chars <= TOKENIZE_INLINE_CHARS:
        return tokenize(*args)
    return await asyncio.get_running_loop().run_in_executor(_TOKENIZER_THREAD, functools.partial(tokenize, *args))
