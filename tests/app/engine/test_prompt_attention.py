"""Each token's attention to the prompt, computed while decoding and scoring, against eager attention."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import PreTrainedModel

from app.engine.engine import Engine
from app.engine.loading import LoadedModel
from app.engine.prompt_attention import (
    PROMPT_MASS,
    is_prompt_statistic,
    prompt_statistic_names,
    wants_prompt_statistics,
)
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.engine.token_stats import TOKEN_STATISTICS
from tests.app.engine.eager_reference import eager_prompt_attention, prompt_statistics_of, prompts
from tests.conftest import N_LAGS


@pytest.fixture(scope="module")
def prompt_engine(tiny_loaded: LoadedModel) -> Engine:
    return Engine(tiny_loaded, n_lags=N_LAGS, prompt_statistics=True)


def test_names_are_per_family_layer_and_head_and_only_this_models(tiny_loaded: LoadedModel) -> None:
    layers, heads = tiny_loaded.identity.num_layers, tiny_loaded.identity.num_heads
    names = prompt_statistic_names(layers, heads)
    assert len(names) == len(set(names)) == 2 * layers * heads
    assert names[0] == "prompt_mass_l00_h0" and names[-1] == f"prompt_sink_l{layers - 1:02d}_h{heads - 1}"
    assert all(is_prompt_statistic(name, layers, heads) for name in names)
    assert not is_prompt_statistic(f"prompt_mass_l{layers:02d}_h0", layers, heads)
    assert not is_prompt_statistic(f"prompt_mass_l00_h{heads}", layers, heads)
    assert not is_prompt_statistic("prompt_mass_l0_h0", layers, heads)  # spelt otherwise than the engine writes
    assert wants_prompt_statistics(["entropy", names[3]]) and not wants_prompt_statistics(["entropy"])


def test_generation_records_each_tokens_attention_to_the_prompt_as_eager_attention_has_it(
    prompt_engine: Engine, eager_model: PreTrainedModel
) -> None:
    batch = prompts(prompt_engine)  # three lengths: one left-padded batch
    sequences = prompt_engine.generate([GenerationRequest(tuple(p), SamplingParams(max_new_tokens=10)) for p in batch])
    for prompt, sequence in zip(batch, sequences, strict=True):
        trace = prompt_engine.trace(sequence)
        answer = list(trace.token_ids)
        assert len(answer) > 1
        values = prompt_statistics_of(prompt_engine, dict(trace.stats))
        # The first token's from the prefill's last query, the rest from decode steps.
        np.testing.assert_allclose(values, eager_prompt_attention(eager_model, prompt, answer), atol=1e-5)
        mass, sink = np.split(values, 2, axis=1)
        assert np.all(mass > 0) and np.all(sink > 0) and np.all(mass + sink <= 1 + 1e-6)


def test_rows_that_join_and_leave_the_batch_keep_their_prompts_columns(
    prompt_engine: Engine, eager_model: PreTrainedModel
) -> None:
    """Continuous batching pads, merges and trims the key columns under each row's prompt."""
    batch = prompts(prompt_engine) * 2
    requests = [
        GenerationRequest(tuple(p), SamplingParams(max_new_tokens=3 + 4 * (index % 3))) for index, p in enumerate(batch)
    ]
    finished = dict(prompt_engine.generate_continuously(requests, max_batch=2))
    assert sorted(finished) == list(range(len(requests)))
    for index, sequence in finished.items():
        trace = prompt_engine.trace(sequence)
        expected = eager_prompt_attention(eager_model, batch[index], list(trace.token_ids))
        np.testing.assert_allclose(prompt_statistics_of(prompt_engine, dict(trace.stats)), expected, atol=1e-5)


def test_teacher_forced_scoring_reproduces_them_and_the_rows(prompt_engine: Engine, engine: Engine) -> None:
    batch = prompts(prompt_engine)
    generated = prompt_engine.generate([GenerationRequest(tuple(p), SamplingParams(max_new_tokens=8)) for p in batch])
    pairs = [(p, list(prompt_engine.trace(s).token_ids)) for p, s in zip(batch, generated, strict=True)]
    scored, plain = prompt_engine.score(pairs), engine.score(pairs)
    for sequence, trace, without in zip(generated, scored, plain, strict=True):
        expected = prompt_engine.trace(sequence)
        np.testing.assert_allclose(
            prompt_statistics_of(prompt_engine, dict(trace.stats)),
            prompt_statistics_of(prompt_engine, dict(expected.stats)),
            atol=1e-5,
        )
        # The extra query row for the first token leaves the step rows and log-probs as they are.
        np.testing.assert_allclose(trace.attention, without.attention, atol=1e-6)
        np.testing.assert_allclose(trace.logprobs, without.logprobs, atol=1e-6)
        assert set(without.stats) == set(TOKEN_STATISTICS)
    empty = prompt_engine.score([(batch[0], [])])[0]
    assert set(empty.stats) == set(prompt_engine.context.statistic_names)


def test_they_need_capture_and_leave_with_it(prompt_engine: Engine, engine: Engine, tiny_loaded: LoadedModel) -> None:
    with pytest.raises(ValueError, match="need attention capture"):
        Engine(tiny_loaded, n_lags=0, prompt_statistics=True)
    added = engine.with_prompt_statistics()
    assert added.prompt_statistics and added.context.statistic_names == prompt_engine.context.statistic_names
    assert added.token_text(added.encode_response("who")[0]) == "who"
    plain = prompt_engine.with_lags(0)
    assert not plain.prompt_statistics and plain.context.statistic_names == tuple(TOKEN_STATISTICS)
    sequence = plain.generate([GenerationRequest(tuple(prompts(plain)[0]), SamplingParams(max_new_tokens=3))])[0]
    assert not any(name.startswith(PROMPT_MASS) for name in plain.trace(sequence).stats)


def test_a_prefill_in_chunks_and_a_chunked_scoring_pass_give_the_same(
    prompt_engine: Engine, eager_model: PreTrainedModel
) -> None:
    batch = prompts(prompt_engine)
    prefill = prompt_engine.start_prefill(
        [GenerationRequest(tuple(p), SamplingParams(max_new_tokens=6)) for p in batch]
    )
    decoding = None
    while decoding is None:
        decoding = prefill.advance(max_tokens=5)  # a few columns at a time, the last chunk with the first token
    sequences = list(decoding.sequences)
    decoding.pop_done()
    while decoding.sequences:
        decoding.step()
        decoding.pop_done()
    answers = [list(prompt_engine.trace(sequence).token_ids) for sequence in sequences]
    scoring = prompt_engine.start_scoring(list(zip(batch, answers, strict=True)))
    traces = None
    while traces is None:
        traces = scoring.advance(max_tokens=5)
    for prompt, answer, sequence, trace in zip(batch, answers, sequences, traces, strict=True):
        expected = eager_prompt_attention(eager_model, prompt, answer)
        generated = prompt_statistics_of(prompt_engine, dict(prompt_engine.trace(sequence).stats))
        np.testing.assert_allclose(generated, expected, atol=1e-5)
        np.testing.assert_allclose(prompt_statistics_of(prompt_engine, dict(trace.stats)), expected, atol=1e-5)
