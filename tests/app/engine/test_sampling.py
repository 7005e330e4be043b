"""Which token is drawn: temperature reshapes the distribution, top-p keeps its nucleus, greedy takes the argmax.

Draws come from seeded generators, so the frequencies below are the same on every run; the bounds around
the expected frequencies are about five standard errors of that many draws."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from app.engine.sampling import SamplingParams, choose_token, make_generator

PROBS = [0.5, 0.3, 0.15, 0.05]
DRAWS = 4000


def _frequencies(params: SamplingParams, probs: list[float] = PROBS) -> dict[int, float]:
    # Shifted logits: only their differences matter, as with a model's.
    logits = torch.tensor([math.log(p) + 3.0 for p in probs])
    generator = make_generator(params)
    counts = Counter(choose_token(logits, params, generator) for _ in range(DRAWS))
    return {token: count / DRAWS for token, count in counts.items()}


def _tempered(temperature: float) -> list[float]:
    weights = [p ** (1 / temperature) for p in PROBS]
    return [w / sum(weights) for w in weights]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_draws_from_the_tempered_distribution(temperature: float) -> None:
    frequencies = _frequencies(SamplingParams(temperature=temperature, seed=1))
    for token, expected in enumerate(_tempered(temperature)):
        bound = 5 * math.sqrt(expected * (1 - expected) / DRAWS)
        assert frequencies.get(token, 0.0) == pytest.approx(expected, abs=bound)


def test_top_p_draws_only_from_the_smallest_prefix_reaching_it() -> None:
    # Cumulative 0.5, 0.8, 0.95, 1.0: top-p 0.7 keeps the first two, renormalised.
    frequencies = _frequencies(SamplingParams(temperature=1.0, top_p=0.7, seed=2))
    assert set(frequencies) == {0, 1}
    assert frequencies[0] == pytest.approx(0.5 / 0.8, abs=5 * math.sqrt(0.625 * 0.375 / DRAWS))


def test_top_p_applies_to_the_tempered_distribution() -> None:
    # At temperature 0.5 the first token alone holds 0.685 of the mass: top-p 0.6 keeps only it.
    assert _frequencies(SamplingParams(temperature=0.5, top_p=0.6, seed=3)) == {0: 1.0}
    assert set(_frequencies(SamplingParams(temperature=1.0, top_p=0.6, seed=3))) == {0, 1}


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=5e-324, seed=4),  # below MIN_SAMPLING_TEMPERATURE: greedy
        SamplingParams(temperature=1.0, top_p=5e-324, seed=4),  # a nucleus smaller than any token: the top one
        SamplingParams(temperature=2.0, top_p=1e-30, seed=4),
    ],
)
def test_degenerate_settings_take_the_most_likely_token(params: SamplingParams) -> None:
    # The most likely token last, so that a draw from the front of the vocabulary cannot pass for it.
    assert _frequencies(params, list(reversed(PROBS))) == {len(PROBS) - 1: 1.0}


def test_greedy_needs_no_generator_and_a_seed_fixes_the_draws() -> None:
    assert make_generator(SamplingParams(temperature=0.0, seed=5)) is None
    first = _frequencies(SamplingParams(temperature=1.0, seed=5))
    assert _frequencies(SamplingParams(temperature=1.0, seed=5)) == first
    assert _frequencies(SamplingParams(temperature=1.0, seed=6)) != first
