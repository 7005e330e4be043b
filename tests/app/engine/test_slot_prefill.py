"""The compiled prompt prefill equals the eager one: first tokens, statistics, keys and what decodes after.

One program compiled once (a few seconds) runs prompts of every length it takes: nothing compiles again
at request time (`fail_on_recompile`).
"""

from __future__ import annotations

import pytest
import torch

from app.engine.decoding import DecodeBatch, PromptPrefill
from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest, SequenceState
from app.engine.slot_decoding import SlotDecodeBatch
from app.engine.slot_prefill import SHORTEST_PROMPT, CompiledPromptPrefill
from tests.app.engine.eager_reference import assert_same_sequences, prompts

SLOT_LENGTH = 128
SLOTS = 4


@pytest.fixture(scope="module")
def compiled(engine: Engine) -> Engine:
    compiled = Engine(engine.loaded, n_lags=engine.n_lags, compiled_decode_length=SLOT_LENGTH)
    assert compiled.warm_up_compiled_decode(slots=SLOTS) is not None
    return compiled


def _slot_batch(engine: Engine) -> SlotDecodeBatch:
    batch = engine.running_batch(SLOTS)
    assert batch is not None
    return batch


def _requests(engine: Engine, **params: object) -> list[GenerationRequest]:
    """Chat prompts of three lengths and the shortest prompt the program takes."""
    rows = [*prompts(engine), [5, 9][:SHORTEST_PROMPT]]
    return [GenerationRequest(tuple(row), SamplingParams(max_new_tokens=6, **params)) for row in rows]  # type: ignore[arg-type]


def _decode(batch: SlotDecodeBatch, joined: DecodeBatch) -> list[SequenceState]:
    sequences = list(joined.sequences)
    batch.merge(joined)
    batch.pop_done()
    while batch.sequences:
        batch.step()
        batch.pop_done()
    return sequences


def test_prompts_it_takes_are_prefilled_compiled_and_others_eagerly(compiled: Engine, engine: Engine) -> None:
    assert isinstance(compiled.start_prefill(_requests(compiled)), CompiledPromptPrefill)
    one_token = GenerationRequest((5,), SamplingParams(max_new_tokens=2))
    too_long = GenerationRequest((5,) * (SLOT_LENGTH - 1), SamplingParams(max_new_tokens=2))
    for request in (one_token, too_long):
        assert isinstance(compiled.start_prefill([request, *_requests(compiled)]), PromptPrefill)
    assert isinstance(engine.start_prefill(_requests(engine)), PromptPrefill)  # the eager loop: nothing compiled


def test_the_first_token_and_the_keys_equal_the_eager_prefill(compiled: Engine) -> None:
    for request in _requests(compiled):
        job = compiled.start_prefill([request])
        assert isinstance(job, CompiledPromptPrefill)
        with torch.compiler.set_stance("fail_on_recompile"):
            fast = job.advance()
        eager = PromptPrefill(compiled.context, [request]).advance()
        assert fast is not None and eager is not None
        assert list(fast.sequences[0].token_ids()) == list(eager.sequences[0].token_ids())
        for name, value in eager.sequences[0].tokens[0].stats.items():
            assert fast.sequences[0].tokens[0].stats[name] == pytest.approx(value, abs=1e-5)
        assert torch.equal(fast.positions, eager.positions) and torch.equal(fast.attention_mask, eager.attention_mask)
        for mine, theirs in zip(fast.cache.layers, eager.cache.layers, strict=True):
            torch.testing.assert_close(mine.keys, theirs.keys, atol=1e-5, rtol=0)
            torch.testing.assert_close(mine.values, theirs.values, atol=1e-5, rtol=0)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "seed": 7}], ids=["greedy", "seeded"])
def test_a_compiled_group_decodes_as_each_request_alone(compiled: Engine, sampling: dict[str, object]) -> None:
    requests = _requests(compiled, **sampling)
    job = compiled.start_prefill(requests)
    with torch.compiler.set_stance("fail_on_recompile"):
        joined = job.advance()
        assert joined is not None
        decoded = _decode(_slot_batch(compiled), joined)
    for request, sequence in zip(requests, decoded, strict=True):
        assert_same_sequences(compiled, sequence, compiled.generate([request])[0])


def test_a_group_larger_than_the_budget_is_chunked_by_columns(compiled: Engine) -> None:
    requests = _requests(compiled)
    job = compiled.start_prefill(requests)
    budget = len(requests) * 8  # 8 columns a pass: the longest prompt takes several
    passes = 1
    while (joined := job.advance(budget)) is None:
        passes += 1
    longest = max(len(request.prompt_ids) for request in requests)
    assert passes == -(-longest // 8)
    for request, sequence in zip(requests, _decode(_slot_batch(compiled), joined), strict=True):
        assert_same_sequences(compiled, sequence, compiled.generate([request])[0])
