"""Capture in bfloat16: rows and log-probs within bf16's rounding of eager attention's, and of `/v1/score`'s.

bfloat16 keeps 8 significant bits (a relative step of 2^-8 = 0.004), and every matmul of a
forward rounds to it, so two correct computations of the same weights differ by a few such
steps. The tolerances (docs/method.md, "Numerics"): attention weights within 0.02
absolute, log-probs within 0.15 nats; on this model eager attention in bf16 is itself up
to 0.008 and 0.06 from float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from app.engine.engine import Engine
from app.engine.loading import load_model
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from tests.app.engine.eager_reference import eager_rows, generated_only, prompts

ROW_TOLERANCE = 0.02
LOGPROB_TOLERANCE = 0.15
N_LAGS = 4


@pytest.fixture(scope="module")
def bf16_engine(tiny_model_dir: Path) -> Engine:
    return Engine(load_model(str(tiny_model_dir), dtype="bfloat16"), n_lags=N_LAGS)


@pytest.fixture(scope="module")
def bf16_eager(tiny_model_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, attn_implementation="eager", dtype=torch.bfloat16
    ).eval()


def test_the_model_runs_in_bfloat16(bf16_engine: Engine) -> None:
    assert bf16_engine.loaded.model.dtype == torch.bfloat16


def test_generated_rows_and_logprobs_match_eager_in_bfloat16(bf16_engine: Engine, bf16_eager: PreTrainedModel) -> None:
    batch = prompts(bf16_engine)  # different lengths: rows are left-padded
    results = bf16_engine.generate([GenerationRequest(tuple(p), SamplingParams(max_new_tokens=9)) for p in batch])
    for prompt, sequence in zip(batch, results, strict=True):
        trace = bf16_engine.trace(sequence)
        assert trace.attention is not None and trace.attention.dtype == np.float32
        expected, logprobs = eager_rows(bf16_eager, prompt, list(trace.token_ids), N_LAGS)
        np.testing.assert_allclose(generated_only(trace.attention), expected, atol=ROW_TOLERANCE)
        np.testing.assert_allclose(trace.logprobs, logprobs, atol=LOGPROB_TOLERANCE)


def test_generating_rows_equal_those_of_scoring_the_same_answer_in_bfloat16(bf16_engine: Engine) -> None:
    batch = prompts(bf16_engine)
    results = bf16_engine.generate([GenerationRequest(tuple(p), SamplingParams(max_new_tokens=9)) for p in batch])
    for prompt, sequence in zip(batch, results, strict=True):
        generated = bf16_engine.trace(sequence)
        scored = bf16_engine.score([(prompt, list(generated.token_ids))])[0]
        assert scored.attention is not None and generated.attention is not None
        np.testing.assert_allclose(
            generated_only(scored.attention), generated_only(generated.attention), atol=ROW_TOLERANCE
        )
        np.testing.assert_allclose(scored.logprobs, generated.logprobs, atol=LOGPROB_TOLERANCE)
