"""Batched generation: same tokens and features as one by one; raw-logit probabilities; stops; seeds."""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace

import numpy as np
import pytest
import torch

from app.engine.decoding import DecodeBatch, run_continuously, run_to_completion
from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import FinishReason, GenerationRequest
from tests.app.engine.eager_reference import assert_same_sequences, prompts

TOLERANCE = 1e-5


def _requests(engine: Engine, **params: object) -> list[GenerationRequest]:
    return [GenerationRequest(tuple(p), SamplingParams(**params)) for p in prompts(engine)]  # type: ignore[arg-type]


def test_batched_equals_one_by_one(engine: Engine) -> None:
    requests = _requests(engine, max_new_tokens=12)
    batched = engine.generate(requests)
    for request, sequence in zip(requests, batched, strict=True):
        assert_same_sequences(engine, sequence, engine.generate([request])[0])


def test_sequences_joining_a_running_batch_equal_alone(engine: Engine) -> None:
    first, second, third = _requests(engine, max_new_tokens=10)
    batch = DecodeBatch.prefill(engine.context, [first])
    everything = list(batch.sequences)
    for _ in range(3):
        batch.step()
    joining = DecodeBatch.prefill(engine.context, [second, third])
    everything += joining.sequences
    batch.merge(joining)
    while batch.sequences:
        batch.step()
        batch.pop_done()
    for request, sequence in zip((first, second, third), everything, strict=True):
        assert_same_sequences(engine, sequence, engine.generate([request])[0])


@pytest.mark.parametrize("min_join", [1, 2])
def test_continuous_batching_refills_rows_and_equals_alone(engine: Engine, min_join: int) -> None:
    # Different lengths, so rows finish at different steps and waiting requests join mid-run.
    requests = [
        replace(request, params=replace(request.params, max_new_tokens=length))
        for request, length in zip(_requests(engine, max_new_tokens=1) * 2, (3, 9, 1, 6, 12, 4), strict=True)
    ]
    finished = list(run_continuously(engine.context, requests, max_batch=2, min_join=min_join))
    assert sorted(index for index, _ in finished) == list(range(len(requests)))
    # The short ones end first: the order of yields follows the answers' lengths, not the input order.
    assert [index for index, _ in finished] != list(range(len(requests)))
    for index, sequence in finished:
        assert len(sequence.tokens) == requests[index].params.max_new_tokens
        assert_same_sequences(engine, sequence, engine.generate([requests[index]])[0])


def test_continuous_batching_refuses_impossible_sizes_and_handles_nothing(engine: Engine) -> None:
    requests = _requests(engine, max_new_tokens=2)
    for max_batch, min_join in ((0, 1), (2, 0), (2, 3)):
        with pytest.raises(ValueError, match="min_join"):
            list(run_continuously(engine.context, requests, max_batch=max_batch, min_join=min_join))
    assert list(run_continuously(engine.context, [], max_batch=2)) == []


def test_probabilities_come_from_raw_logits_even_when_sampling(engine: Engine) -> None:
    prompt = prompts(engine)[0]
    params = SamplingParams(max_new_tokens=10, temperature=1.7, top_p=0.8, seed=11)
    sequence = engine.generate([GenerationRequest(tuple(prompt), params)])[0]
    trace = engine.trace(sequence)
    ids = torch.tensor([prompt + list(trace.token_ids)])
    with torch.inference_mode():
        logits = engine.loaded.model(ids).logits[0, len(prompt) - 1 : -1].float()
    raw = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(trace.token_ids)[:, None])[:, 0]
    np.testing.assert_allclose(trace.logprobs, raw.double().numpy(), atol=TOLERANCE)
    tempered = torch.log_softmax(logits / params.temperature, dim=-1).gather(-1, torch.tensor(trace.token_ids)[:, None])
    assert not np.allclose(trace.logprobs, tempered[:, 0].double().numpy(), atol=1e-3)


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(engine: Engine) -> None:
    requests = _requests(engine, max_new_tokens=10, temperature=1.0, seed=5)
    alone = [engine.trace(engine.generate([r])[0]).token_ids for r in requests]
    together = [engine.trace(s).token_ids for s in engine.generate(requests)]
    assert alone == together
    other_seed = replace(requests[2], params=replace(requests[2].params, seed=6))
    draws = {engine.trace(engine.generate([other_seed])[0]).token_ids, together[2]}
    assert len(draws) == 2


def test_length_limit_computes_the_last_tokens_row(engine: Engine) -> None:
    sequence = engine.generate(_requests(engine, max_new_tokens=7)[:1])[0]
    assert sequence.finish_reason is FinishReason.LENGTH
    assert len(sequence.tokens) == 7 == len(sequence.attention_rows)


def test_stop_string_cuts_the_text_and_keeps_its_tokens(engine: Engine) -> None:
    request = _requests(engine, max_new_tokens=12)[0]
    free = engine.generate([request])[0]
    words = free.text.split()
    stop = words[3]
    stopped = engine.generate([replace(request, params=replace(request.params, stop=(stop,)))])[0]
    assert stopped.finish_reason is FinishReason.STOP
    assert stop not in stopped.text
    assert free.text.startswith(stopped.text)
    kept = engine.decode([t.token_id for t in stopped.kept_tokens])
    assert kept.startswith(stopped.text) and len(stopped.attention_rows) == stopped.n_kept


def test_a_sequence_searching_for_stop_strings_does_not_keep_its_prefill_batch_alive(engine: Engine) -> None:
    """The stop search's text is kept with the sequence across steps: it must not hold the batch that chose the
    first token, whose cache the running batch has copied (a second copy of the prompts' keys and values)."""
    request = _requests(engine, max_new_tokens=4, stop=("never appears",))[0]
    prefilled = DecodeBatch.prefill(engine.context, [request])
    sequence = prefilled.sequences[0]
    assert sequence.stop_search_text is not None
    gone = weakref.ref(prefilled)
    del prefilled
    gc.collect()
    assert gone() is None


def test_stop_tokens_end_generation_unscored(engine: Engine) -> None:
    request = _requests(engine, max_new_tokens=12)[0]
    free = engine.generate([request])[0]
    third = free.tokens[2].token_id
    context = replace(engine.context, stop_token_ids=engine.context.stop_token_ids | {third})
    ended = run_to_completion(context, [request])[0]
    assert ended.finish_reason is FinishReason.STOP
    assert [t.token_id for t in ended.kept_tokens] == [t.token_id for t in free.tokens[:2]]
    assert len(ended.attention_rows) == 2
    # Three tokens chosen, the stop token with them (the time per output token's count); a length cut, as many
    # as it kept.
    assert ended.tokens_chosen == 3 and free.tokens_chosen == len(free.tokens) == 12


def test_without_capture_no_rows_and_same_tokens(engine: Engine) -> None:
    plain = engine.with_lags(0)
    request = _requests(engine, max_new_tokens=8)[1]
    a, b = plain.generate([request])[0], engine.generate([request])[0]
    assert plain.trace(a).attention is None
    assert plain.trace(a).token_ids == engine.trace(b).token_ids


def test_a_failing_row_ends_only_its_own_sequence(engine: Engine, monkeypatch) -> None:
    import app.engine.decoding as decoding

    real = decoding.choose_token

    def failing(logits, params, generator):
        if params.seed == 13:
            raise RuntimeError("probability tensor contains nan")
        return real(logits, params, generator)

    monkeypatch.setattr(decoding, "choose_token", failing)
    good, bad = _requests(engine, max_new_tokens=6, temperature=1.0, seed=1)[:2]
    bad = replace(bad, params=replace(bad.params, seed=13))
    ok, failed = engine.generate([good, bad])
    assert failed.finish_reason is FinishReason.ERROR and failed.kept_tokens == []
    assert ok.finish_reason is FinishReason.LENGTH
    assert engine.trace(ok).token_ids == engine.trace(engine.generate([good])[0]).token_ids


def test_extreme_sampling_parameters_do_not_fail(engine: Engine) -> None:
    for temperature, top_p in ((5e-324, 1.0), (1.0, 5e-324), (2.0, 1e-30)):
        request = _requests(engine, max_new_tokens=4, temperature=temperature, top_p=top_p, seed=0)[0]
        assert len(engine.generate([request])[0].tokens) > 0


def test_abandoning_a_sequence_waiting_for_its_last_row(engine: Engine) -> None:
    batch = DecodeBatch.prefill(engine.context, _requests(engine, max_new_tokens=3)[:1])
    sequence = batch.sequences[0]
    while not sequence.finished:
        batch.step()
    assert sequence.finish_reason is FinishReason.LENGTH and sequence.needs_final_row
    sequence.abandon(FinishReason.CANCELLED)  # the client left during the extra step
    assert batch.pop_done() == [sequence]
    assert sequence.finish_reason is FinishReason.CANCELLED and not sequence.needs_final_row
    assert sequence.n_kept == len(sequence.attention_rows) == 2


def test_generating_convention_needs_no_extra_step_and_scores_like_teacher_forcing(engine: Engine) -> None:
    from app.uncertainty.features import Convention, FeatureSpec
    from app.uncertainty.tad import TadScorer
    from tests.app.uncertainty.test_tad import _linear

    no_last_row = Engine(engine.loaded, n_lags=engine.n_lags, last_row=False)
    requests = _requests(engine, max_new_tokens=7)
    with_step = engine.generate(requests)
    without = no_last_row.generate(requests)
    identity = engine.identity
    spec = FeatureSpec(engine.n_lags, identity.num_layers, identity.num_heads, convention=Convention.GENERATING)
    scorer = TadScorer(_linear(np.random.default_rng(0).normal(0, 0.1, spec.stage2_size), 0.4), spec, 1e-4)
    for request, full, short in zip(requests, with_step, without, strict=True):
        assert [t.token_id for t in short.tokens] == [t.token_id for t in full.tokens]
        if short.finish_reason is FinishReason.LENGTH:
            assert len(short.attention_rows) == len(short.tokens) - 1  # the last token's own step never ran
            assert len(full.attention_rows) == len(full.tokens)
        trace = no_last_row.trace(short)
        scored = engine.score([(request.prompt_ids, trace.token_ids)])[0]
        np.testing.assert_allclose(
            scorer.confidences(trace.logprobs, trace.attention),
            scorer.confidences(scored.logprobs, scored.attention),
            atol=1e-5,
        )
