"""Per-token statistics of the raw distribution (app/engine/token_stats.py)."""

from __future__ import annotations

import math

import torch

from app.engine.sampling import RawDistribution


def test_masked_tokens_contribute_nothing_to_the_entropy() -> None:
    # Models that mask tokens give them logit -inf; -p log p must then be 0, not NaN.
    logits = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")], [1.0, 2.0, 3.0, 4.0]])
    stats = RawDistribution.from_logits(logits).token_stats(torch.tensor([0, 3]))
    assert math.isclose(stats["entropy"][0], math.log(2), rel_tol=1e-6)
    probs = torch.softmax(logits[1], dim=-1)
    assert math.isclose(stats["entropy"][1], float(-(probs * probs.log()).sum()), rel_tol=1e-5)
    assert math.isclose(stats["logprob"][0], math.log(0.5), rel_tol=1e-6)
    assert all(math.isfinite(value) for values in stats.values() for value in values)


def test_top2_margin_is_the_gap_between_the_two_likeliest_tokens() -> None:
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.34, 0.33, 0.33]])
    stats = RawDistribution.from_logits(probs.log()).token_stats(torch.tensor([1, 2]))
    assert math.isclose(stats["top2_margin"][0], 0.3, rel_tol=1e-5)
    assert math.isclose(stats["top2_margin"][1], 0.01, rel_tol=1e-3)
