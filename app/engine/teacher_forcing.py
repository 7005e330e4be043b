"""Scoring a given answer with one teacher-forced forward pass.

For an answer the service generated itself, this reproduces the probabilities,
entropies and attention rows of generation (to float rounding): the prompt and answer
token ids are the same, and so are the positions and the capture convention.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import DynamicCache

from app.engine.decoding import DecodeContext, left_pad, positions_from_mask
from app.engine.sampling import RawDistribution
from app.engine.token_stats import TOKEN_STATISTICS
from app.uncertainty.trace import TokenTrace


def score_responses(context: DecodeContext, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[TokenTrace]:
    """Traces of each (prompt ids, response ids) pair, computed in one left-padded batch."""
    if not pairs:
        return []
    if any(len(prompt) == 0 for prompt, _ in pairs):
        raise ValueError("a prompt must have at least one token")
    lengths = [len(response) for _, response in pairs]
    longest = max(lengths)
    if longest == 0:
        return [_empty_trace(context) for _ in pairs]
    ids, mask = left_pad([list(prompt) + list(response) for prompt, response in pairs], context.pad_token_id)
    ids, mask = ids.to(context.device), mask.to(context.device)
    width = ids.shape[1]
    capture = context.new_capture(query_start=width - longest)
    with torch.inference_mode():
        output = context.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions_from_mask(mask),
            past_key_values=DynamicCache(config=context.model.config),
            use_cache=True,
            logits_to_keep=longest + 1,
            tad_capture=capture,
        )
    # logits[:, j] predicts the token at column width - longest + j.
    logits = output.logits[:, :-1, :]
    rows = capture.stacked().numpy() if capture is not None else None  # [b, longest, L, H, N + 1]
    traces = []
    for index, (_, response) in enumerate(pairs):
        count = lengths[index]
        if count == 0:
            traces.append(_empty_trace(context))
            continue
        start = longest - count
        distribution = RawDistribution.from_logits(logits[index, start:longest])
        targets = torch.tensor(list(response), dtype=torch.long, device=distribution.log_probs.device)
        stats = distribution.token_stats(targets)
        traces.append(
            TokenTrace(
                token_ids=tuple(int(t) for t in response),
                stats={name: np.array(values, dtype=np.float64) for name, values in stats.items()},
                attention=None if rows is None else np.ascontiguousarray(rows[index, start:longest]),
            )
        )
    return traces


def _empty_trace(context: DecodeContext) -> TokenTrace:
    return TokenTrace(
        token_ids=(),
        stats={name: np.zeros(0) for name in TOKEN_STATISTICS},
        attention=None if not context.capturing else np.zeros((0, 0, 0, context.n_lags + 1), dtype=np.float32),
    )
