"""Scoring a generated answer by teacher forcing reproduces what generation recorded."""

from __future__ import annotations

import numpy as np

from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from tests.app.engine.eager_reference import prompts


def test_teacher_forced_trace_equals_generation(engine: Engine) -> None:
    batch = prompts(engine)
    generated = engine.generate([GenerationRequest(tuple(p), SamplingParams(max_new_tokens=10)) for p in batch])
    pairs = [(p, engine.encode_answer(s.text)) for p, s in zip(batch, generated, strict=True)]
    scored = engine.score(pairs)  # one left-padded batch of different lengths
    for sequence, trace in zip(generated, scored, strict=True):
        expected = engine.trace(sequence)
        assert trace.token_ids == expected.token_ids
        np.testing.assert_allclose(trace.logprobs, expected.logprobs, atol=1e-5)
        np.testing.assert_allclose(trace.entropies, expected.entropies, atol=1e-5)
        np.testing.assert_allclose(trace.attention, expected.attention, atol=1e-5)


def test_empty_response_gives_an_empty_trace(engine: Engine) -> None:
    trace = engine.score([(prompts(engine)[0], [])])[0]
    assert len(trace) == 0 and len(trace.logprobs) == 0
