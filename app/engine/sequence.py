"""The state of one sequence being generated: its tokens, their raw statistics and attention rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import torch

from app.engine.sampling import SamplingParams


class FinishReason(StrEnum):
    STOP = "stop"  # end-of-sequence token, another special token, or a stop string
    LENGTH = "length"  # max_new_tokens reached
    UNCERTAINTY = "uncertainty"  # the running uncertainty crossed the reject threshold
    CANCELLED = "cancelled"  # the client went away
    DEADLINE = "deadline"  # the request ran past its deadline
    ERROR = "error"  # choosing this sequence's token failed; its neighbours are unaffected


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    params: SamplingParams


@dataclass(frozen=True)
class TokenRecord:
    """One generated token and its raw-logit statistics."""

    token_id: int
    logprob: float
    entropy: float
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass
class SequenceState:
    """Mutable per-sequence state, advanced one token per decode step.

    `attention_rows[j]` is the attention row of `tokens[j]` (`[layers, heads, n_lags]`);
    it arrives one step after the token, from the step that consumes it.
    """

    request: GenerationRequest
    generator: torch.Generator | None
    wants_rows: bool = True
    tokens: list[TokenRecord] = field(default_factory=list)
    attention_rows: list[np.ndarray] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    n_kept: int = 0
    text: str = ""
    stop_text_end: int | None = None
    text_final: bool = False  # `text` is the final answer (set when the sequence leaves its batch)
    abandoned: bool = False

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def needs_final_row(self) -> bool:
        """Finished, but the attention row of its last kept token is still to be computed."""
        return self.wants_rows and self.finished and not self.abandoned and len(self.attention_rows) < self.n_kept

    def finish(self, reason: FinishReason, n_kept: int | None = None) -> None:
        if self.finished:
            return
        self.finish_reason = reason
        self.n_kept = len(self.tokens) if n_kept is None else n_kept

    def abandon(self, reason: FinishReason) -> None:
        """Stop now, even if already finished and waiting for a last row; missing rows are not computed."""
        self.finish_reason = reason
        self.n_kept = min(len(self.tokens), len(self.attention_rows)) if self.wants_rows else len(self.tokens)
        self.abandoned = True

    @property
    def kept_tokens(self) -> list[TokenRecord]:
        return self.tokens[: self.n_kept] if self.finished else self.tokens

    def kept_rows(self) -> np.ndarray | None:
        """Rows of the kept tokens `[n, layers, heads, n_lags]`, or None without capture."""
        if not self.wants_rows:
            return None
        rows = self.attention_rows[: len(self.kept_tokens)]
        if not rows:
            return None
        return np.stack(rows)


@dataclass(frozen=True)
class TokenTrace:
    """What the uncertainty methods read of one answer: per scored token, its raw statistics."""

    token_ids: tuple[int, ...]
    logprobs: np.ndarray  # [n] float64, log p_i under the raw logits
    entropies: np.ndarray  # [n] float64, entropy of the full next-token distribution
    attention: np.ndarray | None  # [n, layers, heads, n_lags] float32, or None without capture

    @classmethod
    def from_sequence(cls, seq: SequenceState) -> TokenTrace:
        kept = seq.kept_tokens
        return cls(
            token_ids=tuple(token.token_id for token in kept),
            logprobs=np.array([token.logprob for token in kept], dtype=np.float64),
            entropies=np.array([token.entropy for token in kept], dtype=np.float64),
            attention=seq.kept_rows(),
        )

    def __len__(self) -> int:
        return len(self.token_ids)
