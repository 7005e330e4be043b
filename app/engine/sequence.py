"""The state of one sequence being generated: its tokens, their raw statistics and attention rows."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from operator import attrgetter, itemgetter
from typing import TypeVar, overload

import numpy as np
import torch

from app.engine.prefix_text import PrefixText
from app.engine.sampling import SamplingParams
from app.engine.token_stats import TOKEN_STATISTICS
from app.uncertainty.trace import TokenTrace

T = TypeVar("T")


class FinishReason(StrEnum):
    STOP = "stop"  # end-of-sequence token, another special token, or a stop string
    LENGTH = "length"  # max_new_tokens reached
    UNCERTAINTY = "uncertainty"  # the running uncertainty crossed the reject threshold
    CANCELLED = "cancelled"  # the client went away
    DEADLINE = "deadline"  # the request ran past its deadline
    ERROR = "error"  # choosing this sequence's token failed; its neighbours are unaffected

    @property
    def reported(self) -> str:
        """What a client is told: stop, length, or uncertainty (an early stop)."""
        if self in (FinishReason.LENGTH, FinishReason.UNCERTAINTY):
            return self.value
        return FinishReason.STOP.value


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    params: SamplingParams


@dataclass(frozen=True)
class TokenRecord:
    """One generated token and its raw-logit statistics (`stats[name]`, see `app.engine.token_stats`)."""

    token_id: int
    stats: Mapping[str, float]
    top_logprobs: tuple[tuple[int, float], ...] = ()

    @property
    def logprob(self) -> float:
        return self.stats["logprob"]

    @property
    def entropy(self) -> float:
        return self.stats["entropy"]


class TokenValues(Sequence[T]):
    """One value of each of a run of a sequence's token records (its id, its log-prob), read in place:
    slicing gives another view, so that the decode loop can hand an answer's ids or log-probs out at
    every step without copying them all."""

    __slots__ = ("_start", "_stop", "_tokens", "_value")

    def __init__(
        self, tokens: list[TokenRecord], value: Callable[[TokenRecord], T], start: int = 0, stop: int | None = None
    ) -> None:
        self._tokens = tokens
        self._value = value
        self._start = start
        self._stop = len(tokens) if stop is None else stop

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...

    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return TokenValues(self._tokens, self._value, self._start + start, self._start + max(start, stop))
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError("token index out of range")
        return self._value(self._tokens[self._start + position])

    def __iter__(self) -> Iterator[T]:
        return map(self._value, self._tokens[self._start : self._stop])


_TOKEN_ID: Callable[[TokenRecord], int] = attrgetter("token_id")
_LOGPROB: Callable[[TokenRecord], float] = attrgetter("logprob")


@dataclass
class SequenceState:
    """Mutable per-sequence state, advanced one token per decode step.

    `attention_rows[j]` is the step row of the forward that consumes `tokens[j]`
    (`[layers, heads, n_lags + 1]`, docs/method.md §2); it arrives one step after the token.
    `last_row`: whether the last kept token's own step row is wanted too (the consuming
    convention); an answer cut by its length limit then needs one more 1-token step.
    """

    request: GenerationRequest
    generator: torch.Generator | None
    wants_rows: bool = True
    last_row: bool = True
    tokens: list[TokenRecord] = field(default_factory=list)
    attention_rows: list[np.ndarray] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    n_kept: int = 0
    text: str = ""
    stop_text_end: int | None = None
    text_final: bool = False  # `text` is the final answer (set when the sequence leaves its batch)
    abandoned: bool = False
    ended_on_stop_token: bool = False  # the model chose a stop token, which is not among `tokens`
    # The text of its tokens so far for the stop-string search (`DecodeBatch`), kept across steps.
    stop_search_text: PrefixText | None = field(default=None, repr=False, compare=False)

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    def token_ids(self, count: int | None = None) -> TokenValues[int]:
        """The ids of its first `count` tokens (all by default), without copying them."""
        assert count is None or 0 <= count <= len(self.tokens), (count, len(self.tokens))
        return TokenValues(self.tokens, _TOKEN_ID, 0, count)

    def logprobs(self) -> TokenValues[float]:
        """Its tokens' log-probs, without copying them (TAD's stream reads only the new ones each step; a copy of
        all of them was most of a streamed answer's cost per step)."""
        return TokenValues(self.tokens, _LOGPROB)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def needs_final_row(self) -> bool:
        """Finished, but the attention row of its last kept token is still to be computed."""
        needed = self.n_kept if self.last_row else self.n_kept - 1
        return self.wants_rows and self.finished and not self.abandoned and len(self.attention_rows) < needed

    def finish(self, reason: FinishReason, n_kept: int | None = None) -> None:
        if self.finished:
            return
        self.finish_reason = reason
        self.n_kept = len(self.tokens) if n_kept is None else n_kept

    def abandon(self, reason: FinishReason) -> None:
        """Stop now, even if already finished and waiting for a last row; missing rows are not computed."""
        self.finish_reason = reason
        if self.wants_rows:
            rows = len(self.attention_rows)
            self.n_kept = min(len(self.tokens), rows if self.last_row else rows + 1)
        else:
            self.n_kept = len(self.tokens)
        self.abandoned = True

    @property
    def tokens_chosen(self) -> int:
        """Tokens the model chose for it, a stop token that ended it included (as vLLM counts them for the
        time per output token): each after the first took a decode step, trimmed ones (a stop string) too."""
        return len(self.tokens) + self.ended_on_stop_token

    @property
    def kept_tokens(self) -> list[TokenRecord]:
        return self.tokens[: self.n_kept] if self.finished else self.tokens

    def kept_rows(self) -> np.ndarray | None:
        """Step rows of the kept tokens `[<= n, layers, heads, n_lags + 1]`, or None without capture."""
        if not self.wants_rows:
            return None
        rows = self.attention_rows[: len(self.kept_tokens)]
        if not rows:
            return None
        return np.stack(rows)


def trace_of(sequence: SequenceState) -> TokenTrace:
    """The trace of a sequence's kept tokens, as the uncertainty methods read it."""
    kept = sequence.kept_tokens
    names = tuple(kept[0].stats) if kept else tuple(TOKEN_STATISTICS)
    # One pass over the tokens for every statistic (a table, then its columns), not one pass per statistic.
    table = np.array([itemgetter(*names)(token.stats) for token in kept], dtype=np.float64).reshape(
        len(kept), len(names)
    )
    return TokenTrace(
        token_ids=tuple(token.token_id for token in kept),
        stats={name: table[:, column].copy() for column, name in enumerate(names)},
        attention=sequence.kept_rows(),
    )
