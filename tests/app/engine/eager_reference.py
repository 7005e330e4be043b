"""Reference computations with transformers' eager attention, and shared test prompts."""

from __future__ import annotations

import numpy as np
import torch
from transformers import PreTrainedModel

from app.engine.engine import Engine
from app.engine.sequence import SequenceState


def eager_rows(
    model: PreTrainedModel, prompt: list[int], answer: list[int], n_lags: int
) -> tuple[np.ndarray, np.ndarray]:
    """Reference (step rows [n, layers, heads, lags + 1]: slot k = key k back, raw log-probs [n])."""
    ids = torch.tensor([prompt + answer])
    with torch.no_grad():
        output = model(ids, output_attentions=True)
    start, n = len(prompt), len(answer)
    layers = len(output.attentions)
    heads = output.attentions[0].shape[1]
    rows = np.zeros((n, layers, heads, n_lags + 1), dtype=np.float32)
    for i in range(n):
        query = start + i
        for back in range(0, min(n_lags, i) + 1):
            for layer in range(layers):
                rows[i, layer, :, back] = output.attentions[layer][0, :, query, query - back].float().numpy()
    log_probs = torch.log_softmax(output.logits[0, start - 1 : start + n - 1].float(), dim=-1)
    logprobs = log_probs.gather(-1, torch.tensor(answer)[:, None])[:, 0].double().numpy()
    return rows, logprobs


def generated_only(rows: np.ndarray) -> np.ndarray:
    """Zero the slots whose key is not a generated token (METHOD.md: only generated tokens are keys)."""
    rows = rows.copy()
    for i in range(len(rows)):
        rows[i, :, :, i + 1 :] = 0.0
    return rows


def prompts(engine: Engine) -> list[list[int]]:
    return [
        engine.encode_prompt(messages=[{"role": "user", "content": text}])
        for text in (
            "what is the capital of france ?",
            "who",
            "name the largest river in africa and europe , then the oldest city of asia",
        )
    ]


def assert_same_sequences(engine: Engine, a: SequenceState, b: SequenceState, tolerance: float = 1e-5) -> None:
    """Same tokens, text and finish reason; log-probs, entropies and attention rows within `tolerance`."""
    ta, tb = engine.trace(a), engine.trace(b)
    assert ta.token_ids == tb.token_ids
    assert a.text == b.text and a.finish_reason == b.finish_reason
    np.testing.assert_allclose(ta.logprobs, tb.logprobs, atol=tolerance)
    np.testing.assert_allclose(ta.entropies, tb.entropies, atol=tolerance)
    if ta.attention is None or tb.attention is None:  # a one-token answer under the generating convention
        assert ta.attention is None and tb.attention is None
    else:
        np.testing.assert_allclose(ta.attention, tb.attention, atol=tolerance)
