"""Choosing the next token, and what the raw distribution says about it.

Probabilities and entropies always come from the model's raw logits. Temperature and
top-p change only which token is drawn, never the probability recorded for it: the
uncertainty methods were trained on raw probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from app.engine.token_stats import compute_token_stats

# Below this, dividing logits by the temperature overflows; such temperatures mean greedy anyway.
MIN_SAMPLING_TEMPERATURE = 1e-4


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence picks its tokens. A temperature below 1e-4 (including 0) means greedy."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_SAMPLING_TEMPERATURE


@dataclass(frozen=True)
class RawDistribution:
    """Log-softmax of the raw logits of a batch `[batch, vocab]` (float32)."""

    log_probs: torch.Tensor

    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> RawDistribution:
        return cls(log_probs=torch.log_softmax(logits.float(), dim=-1))

    def token_stats(self, chosen: torch.Tensor) -> dict[str, list[float]]:
        """Every registered per-token statistic (`app.engine.token_stats`) of the chosen tokens."""
        return compute_token_stats(self.log_probs, chosen)


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """A private CPU generator per sampled sequence, so its draws do not depend on its batch."""
    if params.greedy:
        return None
    generator = torch.Generator(device="cpu")
    generator.manual_seed(params.seed if params.seed is not None else 0)
    return generator


def choose_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Pick one token from one row of raw logits `[vocab]`."""
    if params.greedy or generator is None:
        return int(torch.argmax(logits).item())
    scaled = logits.float().cpu() / params.temperature
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        drop = cumulative - sorted_probs >= params.top_p
        drop[0] = False  # top_p smaller than any float32 must still leave the most likely token
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return int(order[choice].item())
    return int(torch.multinomial(probs, 1, generator=generator).item())


def top_alternatives(log_probs: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens of one raw distribution row, as (token id, log-probability)."""
    if k <= 0:
        return []
    values, indices = torch.topk(log_probs, k)
    return [(int(i), float(v)) for i, v in zip(indices.tolist(), values.tolist(), strict=True)]
