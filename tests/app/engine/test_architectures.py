"""Every architecture the service claims, on a tiny random model of it: capture equals eager attention.

One row per family (tests/fixtures/architectures.py). For each: generated rows and raw
log-probabilities equal eager attention's on the full text (float32, 1e-5), on the fused
CPU kernel and on the generic path; batched equals one by one; sequences joining and
leaving a running batch (that model's cache type, sliding-window layers included) equal
alone; a prefill run in chunks (some shorter than the sliding window) equals one forward;
teacher-forced scoring of the answer equals what generation recorded, its prompts in chunks too.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from app.engine.architectures import TESTED_ARCHITECTURES, check_architecture
from app.engine.decoding import DecodeBatch, PromptPrefill
from app.engine.engine import Engine
from app.engine.loading import ModelLoadError, load_model
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest, SequenceState
from app.engine.teacher_forcing import ScoringPass
from tests.app.engine.eager_reference import eager_rows, generated_only, prompts
from tests.fixtures.architectures import ARCHITECTURES, write_architecture

TOLERANCE = 1e-5  # attention rows, float32 (the bound)
# Log-probs sum a whole layer stack's rounding: a fused kernel and eager attention round differently
# (up to ~1.1e-5 seen on one machine's CPU for Gemma-3), so they get a slightly wider bound.
LOGPROB_TOLERANCE = 5e-5
N_LAGS = 6  # more than the fixtures' sliding window: slots beyond it must be exactly zero
NEW_TOKENS = 10


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Engine, PreTrainedModel]:
    directory = write_architecture(request.param, tmp_path_factory.mktemp(request.param) / "model")
    engine = Engine(load_model(str(directory), dtype="float32"), n_lags=N_LAGS)
    eager = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").eval()
    return engine, eager


def _requests(engine: Engine, lengths: tuple[int, ...] = (NEW_TOKENS,) * 3) -> list[GenerationRequest]:
    return [
        GenerationRequest(tuple(p), SamplingParams(max_new_tokens=n))
        for p, n in zip(prompts(engine), lengths, strict=True)
    ]


def _assert_same(engine: Engine, a: SequenceState, b: SequenceState) -> None:
    ta, tb = engine.trace(a), engine.trace(b)
    assert ta.token_ids == tb.token_ids
    np.testing.assert_allclose(ta.logprobs, tb.logprobs, atol=LOGPROB_TOLERANCE)
    np.testing.assert_allclose(ta.attention, tb.attention, atol=TOLERANCE)


def test_the_tested_set_is_what_the_fixtures_build(tmp_path: Path) -> None:
    built = {}
    for name in ARCHITECTURES:
        model = AutoModelForCausalLM.from_config(ARCHITECTURES[name][0](200))
        built[model.config.model_type] = check_architecture(model).tested
    assert built == dict.fromkeys(TESTED_ARCHITECTURES, True)


@pytest.mark.parametrize("fused", [True, False], ids=["fused-cpu-kernel", "generic"])
def test_rows_and_logprobs_equal_eager_attention(family: tuple[Engine, PreTrainedModel], fused: bool) -> None:
    engine, eager = family
    capturing = Engine(engine.loaded, n_lags=N_LAGS, allow_fused_kernel=fused)
    batch = prompts(engine)  # different lengths, all longer than the sliding window: rows are left-padded
    for prompt, sequence in zip(batch, capturing.generate(_requests(engine)), strict=True):
        trace = capturing.trace(sequence)
        assert len(trace) == NEW_TOKENS
        expected, logprobs = eager_rows(eager, prompt, list(trace.token_ids), N_LAGS)
        np.testing.assert_allclose(generated_only(trace.attention), expected, atol=TOLERANCE)
        np.testing.assert_allclose(trace.logprobs, logprobs, atol=LOGPROB_TOLERANCE)


def test_batched_equals_one_by_one(family: tuple[Engine, PreTrainedModel]) -> None:
    engine, _ = family
    requests = _requests(engine)
    for request, sequence in zip(requests, engine.generate(requests), strict=True):
        _assert_same(engine, sequence, engine.generate([request])[0])


def test_sequences_joining_and_leaving_a_running_batch_equal_alone(family: tuple[Engine, PreTrainedModel]) -> None:
    engine, _ = family
    first, second, third = _requests(engine, lengths=(NEW_TOKENS, 4, 7))  # the second leaves early
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
        _assert_same(engine, sequence, engine.generate([request])[0])


@pytest.mark.parametrize("columns", [1, 3, 7])
def test_a_prefill_in_chunks_equals_one_forward(family: tuple[Engine, PreTrainedModel], columns: int) -> None:
    engine, _ = family
    requests = _requests(engine)
    prefill = PromptPrefill(engine.context, requests)
    chunks = 1
    while (batch := prefill.advance(columns * len(requests))) is None:
        chunks += 1
    assert chunks == -(-prefill.columns.width // columns)
    sequences = list(batch.sequences)
    while batch.sequences:
        batch.step()
        batch.pop_done()
    for request, sequence in zip(requests, sequences, strict=True):
        _assert_same(engine, sequence, engine.generate([request])[0])


def test_scoring_the_answer_equals_generating_it(family: tuple[Engine, PreTrainedModel]) -> None:
    engine, _ = family
    request = _requests(engine)[2]
    generated = engine.trace(engine.generate([request])[0])
    scored = engine.score([(list(request.prompt_ids), list(generated.token_ids))])[0]
    np.testing.assert_allclose(scored.logprobs, generated.logprobs, atol=LOGPROB_TOLERANCE)
    np.testing.assert_allclose(generated_only(scored.attention), generated_only(generated.attention), atol=TOLERANCE)


def test_an_untested_architecture_loads_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    from transformers import OlmoConfig

    model = AutoModelForCausalLM.from_config(
        OlmoConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    )
    with caplog.at_level(logging.WARNING):
        support = check_architecture(model)
    assert not support.tested and "olmo" in (support.note or "")
    assert "outside the tested set" in caplog.text


def test_a_model_whose_attention_bypasses_the_interface_is_refused(tmp_path: Path) -> None:
    from transformers import BloomConfig, BloomForCausalLM

    from tests.fixtures.tiny_model import build_tokenizer

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    BloomForCausalLM(BloomConfig(vocab_size=len(tokenizer), hidden_size=32, n_layer=1, n_head=2)).save_pretrained(
        tmp_path / "bloom"
    )
    tokenizer.save_pretrained(tmp_path / "bloom")
    with pytest.raises(ModelLoadError, match="bloom"):
        load_model(str(tmp_path / "bloom"))


@pytest.mark.parametrize("columns", [1, 3, 7])
def test_scoring_with_the_prompts_in_chunks_equals_one_forward(
    family: tuple[Engine, PreTrainedModel], columns: int
) -> None:
    engine, _ = family
    requests = _requests(engine)
    answers = [engine.trace(sequence).token_ids for sequence in engine.generate(requests)]
    pairs = [
        (list(request.prompt_ids), list(answer[:keep]))
        for request, answer, keep in zip(requests, answers, (NEW_TOKENS, 3, 0), strict=True)
    ]
    scoring = ScoringPass(engine.context, pairs)
    chunks = 1
    while (traces := scoring.advance(columns * len(pairs))) is None:
        chunks += 1
    assert chunks > 2
    for chunked, whole in zip(traces, engine.score(pairs), strict=True):
        assert chunked.token_ids == whole.token_ids
        np.testing.assert_allclose(chunked.logprobs, whole.logprobs, atol=LOGPROB_TOLERANCE)
        np.testing.assert_allclose(chunked.attention, whole.attention, atol=TOLERANCE)
