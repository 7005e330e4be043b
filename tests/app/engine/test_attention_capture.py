"""Captured attention rows equal eager attention's weights, without switching to eager attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.engine.attention_capture import CAPTURE_ATTENTION, AttentionCapture
from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.uncertainty.methods import attention_score
from tests.app.engine.eager_reference import eager_rows, generated_only, prompts

TOLERANCE = 1e-5


@pytest.mark.parametrize("fused", [True, False], ids=["fused-cpu-kernel", "generic"])
def test_generation_rows_match_eager_attention(engine: Engine, eager_model, fused: bool) -> None:
    capturing = Engine(engine.loaded, n_lags=engine.n_lags, allow_fused_kernel=fused)
    batch = prompts(engine)  # different lengths: rows are left-padded
    results = capturing.generate([GenerationRequest(tuple(p), SamplingParams(max_new_tokens=9)) for p in batch])
    for prompt, sequence in zip(batch, results, strict=True):
        trace = capturing.trace(sequence)
        assert trace.attention is not None and len(trace.attention) == len(trace)
        expected, logprobs = eager_rows(eager_model, prompt, list(trace.token_ids), capturing.n_lags)
        np.testing.assert_allclose(generated_only(trace.attention), expected, atol=TOLERANCE)
        np.testing.assert_allclose(trace.logprobs, logprobs, atol=TOLERANCE)


def test_teacher_forced_rows_match_eager_attention(engine: Engine, eager_model) -> None:
    prompt = prompts(engine)[0]
    answer = engine.encode_answer("the capital of france is paris .")
    trace = engine.score([(prompt, answer)])[0]
    expected, logprobs = eager_rows(eager_model, prompt, answer, engine.n_lags)
    np.testing.assert_allclose(generated_only(trace.attention), expected, atol=TOLERANCE)
    np.testing.assert_allclose(trace.logprobs, logprobs, atol=TOLERANCE)


def test_attention_score_from_captured_rows_equals_the_reference_formula(engine: Engine, eager_model) -> None:
    # LM-Polygraph's gen-only Attention Score on the full eager attention map: the diagonal of the
    # generated block but its last token, middle layer, log summed over tokens, mean over heads.
    prompt = prompts(engine)[2]
    sequence = engine.generate([GenerationRequest(tuple(prompt), SamplingParams(max_new_tokens=7))])[0]
    trace = engine.trace(sequence)
    answer = list(trace.token_ids)
    with torch.no_grad():
        maps = eager_model(torch.tensor([prompt + answer]), output_attentions=True).attentions
    layer = maps[len(maps) // 2][0].double().numpy()  # [heads, sequence, sequence]
    n = len(answer)
    assert n >= 3  # a sum over several diagonal entries, not the empty one
    block = layer[:, -n:-1, -n:-1]
    expected = -np.mean([np.sum(np.log(np.diag(head) + 1e-12)) for head in block])
    assert attention_score(trace.attention, n) == pytest.approx(expected, rel=1e-5)


def test_model_keeps_sdpa_style_attention(engine: Engine) -> None:
    config = engine.loaded.model.config
    assert config._attn_implementation == CAPTURE_ATTENTION
    assert not config.output_attentions


def test_capture_does_not_change_the_output(engine: Engine) -> None:
    model = engine.loaded.model
    ids = torch.tensor([prompts(engine)[2]])
    with torch.inference_mode():
        plain = model(ids).logits
        capture = AttentionCapture(n_lags=engine.n_lags, num_layers=engine.identity.num_layers, query_start=5)
        captured = model(ids, tad_capture=capture).logits
    assert torch.allclose(plain, captured, atol=1e-6)
    rows = capture.stacked()
    shape = (1, ids.shape[1] - 5, engine.identity.num_layers, engine.identity.num_heads, engine.n_lags + 1)
    assert rows.shape == shape  # keys 0..N back from each query
    # Weights of a softmax row: non-negative, and the N + 1 keys hold at most all of its mass.
    assert (rows >= 0).all() and (rows.sum(-1) <= 1 + 1e-6).all()


def test_additive_mask_is_converted_once_per_mask_and_aligned_for_the_cuda_kernel() -> None:
    capture = AttentionCapture(n_lags=2, num_layers=2)
    full = torch.tensor([[[[False, True, True, True, True]]]])
    sliding = torch.tensor([[[[False, False, False, True, True]]]])
    first = capture.additive_mask(full, torch.float32, aligned=True)
    assert first.shape == full.shape
    assert first.stride(-2) % 16 == 0  # the memory-efficient kernel's bias rows start 16-aligned
    assert torch.equal(first, torch.tensor([[[[-torch.inf, 0.0, 0.0, 0.0, 0.0]]]]))
    assert torch.equal(capture.additive_mask(sliding, torch.float32)[0, 0, 0, :3], torch.full((3,), -torch.inf))
    # Layers alternate between the two masks: each is converted once, then reused.
    assert capture.additive_mask(full, torch.float32, aligned=True) is first
