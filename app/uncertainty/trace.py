"""What every uncertainty method reads of one answer: per token, its raw statistics and attention row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TokenTrace:
    """One scored answer. `stats[name]` is `[n]` float64 per token statistic (see `app.engine.token_stats`)."""

    token_ids: Sequence[int] | np.ndarray  # a tuple when served; a slice of a run's array in training
    stats: Mapping[str, np.ndarray]
    # [step rows, layers, heads, slots] float32 (rows: FeatureSpec.rows_needed(n) or more; slots: keys 0..N
    # back, N + 1), or None without capture
    attention: np.ndarray | None

    @property
    def logprobs(self) -> np.ndarray:
        """log p_i under the raw logits."""
        return self.stats["logprob"]

    @property
    def entropies(self) -> np.ndarray:
        """Entropy of the full next-token distribution at each step."""
        return self.stats["entropy"]

    def __len__(self) -> int:
        return len(self.token_ids)

    def prefix(self, count: int) -> TokenTrace:
        """The first `count` tokens (what is known of an answer still being generated)."""
        return TokenTrace(
            token_ids=self.token_ids[:count],
            stats={name: values[:count] for name, values in self.stats.items()},
            attention=None if self.attention is None else self.attention[:count],
        )
