"""Tokenizing a request's text without stopping the event loop.

A text field may hold 200,000 characters, and a prompt is tokenized before its token count can be
refused. On the event loop that took 50-100 ms during which nothing else was answered: no stream's
next token, no disconnect check, no health probe (`benchmarks/tokenize_stall.py`). The tokenizer
releases the GIL, so a long text goes to a thread of its own; a short one costs less inline than the
thread hop. That thread encodes with a tokenizer of its own (`Engine.with_own_tokenizer`): sharing the
event loop's would let each encode in the other's special-token mode. The copy is made when the first long
text arrives (Qwen2.5-Coder's: 1.9 s on that thread, 115 MB), not at start: most deployments never see one.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from app.engine.engine import Engine

TOKENIZE_INLINE_CHARS = 16_384
_TOKENIZER_THREAD = ThreadPoolExecutor(1, thread_name_prefix="tad-tokenize")
# The tokenizing thread's engines, each with its own tokenizer; read and written on that thread only.
_OWN_ENGINES: weakref.WeakKeyDictionary[Engine, Engine] = weakref.WeakKeyDictionary()

T = TypeVar("T")


def _with_own_tokenizer(engine: Engine, tokenize: Callable[..., T], args: Sequence[object]) -> T:
    own = _OWN_ENGINES.get(engine)
    if own is None:
        own = _OWN_ENGINES[engine] = engine.with_own_tokenizer()
    return tokenize(own, *args)


async def tokenized(chars: int, engine: Engine, tokenize: Callable[..., T], *args: object) -> T:
    """`tokenize(engine, *args)`, off the event loop when its text (`chars` long) is long."""
    if chars <= TOKENIZE_INLINE_CHARS:
        return tokenize(engine, *args)
    return await asyncio.get_running_loop().run_in_executor(
        _TOKENIZER_THREAD, _with_own_tokenizer, engine, tokenize, args
    )
