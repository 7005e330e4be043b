"""Decoding over a slot cache (the step a CUDA graph captures, run eagerly here) equals `DecodeBatch`.

Sequences of different prompt lengths share the slots, join and leave mid-run and reuse freed slots;
tokens, statistics and attention rows equal each request generated alone (float32, 1e-5), on every
tested architecture the slot cache supports; the others are refused with the reason.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from app.engine.decoding import DecodeBatch
from app.engine.engine import Engine
from app.engine.loading import load_model
from app.engine.sampling import SamplingParams
from app.engine.sequence import FinishReason, GenerationRequest, SequenceState
from app.engine.slot_decoding import SlotDecodeBatch, slot_decoding_refusal
from tests.app.engine.eager_reference import assert_same_sequences, prompts
from tests.fixtures.architectures import ARCHITECTURES, write_architecture

REFUSED = {"mistral", "gemma2", "gemma3"}  # sliding-window layers


def _requests(engine: Engine, lengths: tuple[int, ...], **params: object) -> list[GenerationRequest]:
    texts = prompts(engine)
    return [
        GenerationRequest(tuple(texts[i % len(texts)]), SamplingParams(max_new_tokens=n, **params))  # type: ignore[arg-type]
        for i, n in enumerate(lengths)
    ]


def _run_in_slots(
    engine: Engine,
    requests: list[GenerationRequest],
    slots: int,
    max_length: int = 256,
    lookahead: bool = False,
    batch: SlotDecodeBatch | None = None,
) -> list:
    """Continuous batching as the scheduler does it: prefill what fits, merge into free slots, step, pop."""
    if batch is None:
        batch = SlotDecodeBatch(engine.context, slots=slots, max_length=max_length, compiled=False, lookahead=lookahead)
    waiting = list(enumerate(requests))
    done: dict[int, SequenceState] = {}
    while waiting or batch.sequences:
        free = slots - len(batch.sequences)
        if waiting and free:
            taken, waiting = waiting[:free], waiting[free:]
            prefilled = DecodeBatch.prefill(engine.context, [request for _, request in taken])
            done.update((index, sequence) for (index, _), sequence in zip(taken, prefilled.sequences, strict=True))
            batch.merge(prefilled)
            batch.pop_done()
        if batch.sequences:
            batch.step()
            batch.pop_done()
    return [done[index] for index in range(len(requests))]


@pytest.mark.parametrize("last_row", [True, False], ids=["consuming", "generating"])
@pytest.mark.parametrize("lookahead", [False, True], ids=["in-step", "lookahead"])
def test_slots_equal_alone_with_joins_leaves_and_reused_slots(engine: Engine, lookahead: bool, last_row: bool) -> None:
    engine = Engine(engine.loaded, n_lags=engine.n_lags, last_row=last_row)
    requests = _requests(engine, (3, 9, 1, 6, 12, 4, 7))
    for request, sequence in zip(requests, _run_in_slots(engine, requests, 3, lookahead=lookahead), strict=True):
        assert len(sequence.tokens) == request.params.max_new_tokens
        assert_same_sequences(engine, sequence, engine.generate([request])[0])


@pytest.mark.parametrize("lookahead", [False, True], ids=["in-step", "lookahead"])
def test_seeded_sampling_and_greedy_rows_in_slots_equal_alone(engine: Engine, lookahead: bool) -> None:
    sampled = [
        replace(request, params=replace(request.params, seed=seed))
        for seed, request in enumerate(_requests(engine, (8, 5, 8), temperature=0.9, top_p=0.9))
    ]
    requests = [*_requests(engine, (6, 9)), *sampled, *_requests(engine, (4,), top_logprobs=3)]
    for request, sequence in zip(requests, _run_in_slots(engine, requests, 2, lookahead=lookahead), strict=True):
        assert_same_sequences(engine, sequence, engine.generate([request])[0])


def test_without_capture_same_tokens_and_no_rows(engine: Engine) -> None:
    plain = engine.with_lags(0)
    requests = _requests(plain, (6, 6))
    for request, sequence in zip(requests, _run_in_slots(plain, requests, slots=2), strict=True):
        assert sequence.attention_rows == []
        assert engine.trace(sequence).token_ids == engine.trace(plain.generate([request])[0]).token_ids


@pytest.mark.parametrize("lookahead", [False, True], ids=["in-step", "lookahead"])
def test_a_sequence_that_would_outgrow_its_slot_ends_with_length(engine: Engine, lookahead: bool) -> None:
    request = _requests(engine, (500,))[0]
    max_length = len(request.prompt_ids) + 8
    (sequence,) = _run_in_slots(engine, [request], slots=1, max_length=max_length, lookahead=lookahead)
    assert sequence.finish_reason is FinishReason.LENGTH
    assert len(request.prompt_ids) + len(sequence.tokens) == max_length - 1  # the last one fed for its own row
    alone = engine.generate([replace(request, params=replace(request.params, max_new_tokens=len(sequence.tokens)))])[0]
    assert_same_sequences(engine, sequence, alone)


def test_merging_more_rows_than_free_slots_or_a_prompt_longer_than_a_slot_is_refused(engine: Engine) -> None:
    batch = SlotDecodeBatch(engine.context, slots=1, max_length=256, compiled=False)
    with pytest.raises(RuntimeError, match="free slots"):
        batch.merge(DecodeBatch.prefill(engine.context, _requests(engine, (2, 2))))
    small = SlotDecodeBatch(engine.context, slots=1, max_length=4, compiled=False)
    with pytest.raises(ValueError, match="does not fit"):
        small.merge(DecodeBatch.prefill(engine.context, _requests(engine, (2,))))


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_supported_architecture_equals_alone(name: str, tmp_path: Path) -> None:
    engine = Engine(load_model(str(write_architecture(name, tmp_path / "model")), dtype="float32"), n_lags=6)
    refusal = slot_decoding_refusal(engine.context)
    if name in REFUSED:
        assert refusal is not None and "mask" in refusal
        with pytest.raises(ValueError, match="cannot decode over a slot cache"):
            SlotDecodeBatch(engine.context, slots=2, max_length=64, compiled=False)
        return
    assert refusal is None
    requests = _requests(engine, (5, 9, 3, 7))
    for request, sequence in zip(requests, _run_in_slots(engine, requests, 2, lookahead=True), strict=True):
        assert_same_sequences(engine, sequence, engine.generate([request])[0])


def test_the_engine_decodes_eagerly_unless_asked_and_says_why(engine: Engine) -> None:
    assert engine.compiled_decode_refusal() == "compiled decoding is off"
    assert engine.running_batch(2) is None
    assert engine.warm_up_compiled_decode(2) is None
    asked = Engine(engine.loaded, n_lags=engine.n_lags, compiled_decode_length=256)
    assert asked.compiled_decode_refusal() is None
    assert isinstance(asked.running_batch(2), SlotDecodeBatch)
    assert asked.with_lags(0).compiled_decode_length == 256


def test_the_step_compiled_on_cpu_equals_each_request_alone(engine: Engine) -> None:
    """torch.compile's code for the whole step (forward, capture, statistics): the same tokens, statistics and
    rows as the eager loop, with joins, leaves and reused slots, and nothing compiled after `warm_up` (one
    width: compiling takes seconds)."""
    compiled = Engine(engine.loaded, n_lags=engine.n_lags, compiled_decode_length=128)
    assert compiled.warm_up_compiled_decode(slots=3) is not None
    batch = compiled.running_batch(3)
    assert batch is not None and batch.widths() == [128]
    requests = _requests(compiled, (3, 9, 1, 6, 12, 4, 7))
    with torch.compiler.set_stance("fail_on_recompile"):  # warm_up compiled all there is: nothing at request time
        decoded = _run_in_slots(compiled, requests, 3, batch=batch)
    for request, sequence in zip(requests, decoded, strict=True):
        assert len(sequence.tokens) == request.params.max_new_tokens
        assert_same_sequences(compiled, sequence, compiled.generate([request])[0])


def test_a_step_that_fails_to_compile_leaves_the_eager_loop_and_the_reason(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_compiler(self: SlotDecodeBatch) -> float:
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(SlotDecodeBatch, "warm_up", no_compiler)
    asked = Engine(engine.loaded, n_lags=engine.n_lags, compiled_decode_length=256)
    assert asked.warm_up_compiled_decode(2) is None
    refusal = asked.compiled_decode_refusal()
    # the kind of failure for /info; the compiler's own message, which may name paths, only in the log
    assert refusal is not None and "RuntimeError" in refusal and "no C++ compiler found" not in refusal
    assert "no C++ compiler found" in caplog.text
    assert asked.running_batch(2) is None


def test_warm_up_builds_every_width_up_to_the_slot_length(engine: Engine) -> None:
    batch = SlotDecodeBatch(engine.context, slots=2, max_length=300, compiled=False)
    assert batch.widths() == [128, 256, 300]
    assert batch.warm_up() == 0.0  # eager: nothing to build
    batch.merge(DecodeBatch.prefill(engine.context, _requests(engine, (2,))))
    with pytest.raises(RuntimeError, match="empty slots"):
        batch.warm_up()
