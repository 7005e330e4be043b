"""Scoring a given answer with a teacher-forced forward pass (its prompt part in chunks if wanted).

For an answer the service generated itself, this reproduces the probabilities,
entropies, attention rows and attention to the prompt of generation (to float rounding):
the prompt and answer token ids are the same, and so are the positions and the capture
convention.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from app.engine.decoding import ChunkedColumns, DecodeContext
from app.engine.sampling import RawDistribution
from app.uncertainty.trace import TokenTrace


def score_responses(context: DecodeContext, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[TokenTrace]:
    """Traces of each (prompt ids, response ids) pair, computed in one left-padded batch."""
    traces = ScoringPass(context, pairs).advance()
    assert traces is not None
    return traces


class ScoringPass:
    """Teacher-forced scoring of a left-padded batch, the prompts' part runnable a chunk at a time.

    The last forward runs the responses' columns and the one before them (whose logits predict
    the first answer token), with capture; the columns before it only fill the cache, so they
    can run in chunks between decode steps, as a prompt's prefill does (`PromptPrefill`), with
    the same result to float rounding.
    """

    def __init__(self, context: DecodeContext, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
        if any(len(prompt) == 0 for prompt, _ in pairs):
            raise ValueError("a prompt must have at least one token")
        self.context = context
        self.lengths = [len(response) for _, response in pairs]
        self.responses = [tuple(int(t) for t in response) for _, response in pairs]
        self.longest = max(self.lengths, default=0)
        self.done = not pairs or self.longest == 0
        if self.done:
            return
        self.columns = ChunkedColumns(context, [list(prompt) + list(response) for prompt, response in pairs])
        self.tail_start = self.columns.width - self.longest - 1  # >= 0: every prompt has a token
        self.prompt_lengths = [len(prompt) for prompt, _ in pairs]

    def advance(self, max_tokens: int | None = None) -> list[TokenTrace] | None:
        """Run the prompts' next chunk of at most `max_tokens` tokens (at least one column), or, once
        they are in, the last forward (None: everything left in one forward); the traces once that
        has run."""
        if self.done:
            if self.longest == 0:
                return [_empty_trace(self.context) for _ in self.lengths]
            raise RuntimeError("this scoring pass is already done")
        if max_tokens is None or self.columns.done >= self.tail_start:
            return self._last_forward()
        self.columns.fill(self.columns.chunk_end(max_tokens, self.tail_start))
        return None

    def _last_forward(self) -> list[TokenTrace]:
        """The columns left, rows captured for the answer columns only (and the column before them, whose
        query produces the first answer token, for the attention to the prompt)."""
        context, longest, columns = self.context, self.longest, self.columns
        width = columns.width
        prompt = context.prompt_columns(
            [width - length - self.lengths[row] for row, length in enumerate(self.prompt_lengths)],
            self.prompt_lengths,
            width,
        )
        # With the prompt's statistics, query row j produces answer token j (the row's step row is j + 1).
        first_query = self.tail_start if prompt is not None else self.tail_start + 1
        capture = context.new_capture(query_start=first_query - columns.done, prompt=prompt)
        with torch.inference_mode():
            output = context.model(**columns.inputs(width), logits_to_keep=longest + 1, tad_capture=capture)
        self.done = True
        # logits[:, j] predicts the answer token at column tail_start + 1 + j.
        logits = output.logits[:, :-1, :]
        rows = capture.stacked().numpy() if capture is not None else None  # [b, longest (+ 1), L, H, N + 1]
        prompt_values = None
        if capture is not None and prompt is not None:
            rows = rows[:, 1:]  # type: ignore[index]
            prompt_values = capture.prompt_statistics().numpy()[:, :longest]  # [b, longest, statistics]
        traces = []
        for index, response in enumerate(self.responses):
            count = self.lengths[index]
            if count == 0:
                traces.append(_empty_trace(context))
                continue
            start = longest - count
            distribution = RawDistribution.from_logits(logits[index, start:longest])
            targets = torch.tensor(list(response), dtype=torch.long, device=distribution.log_probs.device)
            token_stats = distribution.token_stats(targets)
            stats = {name: np.array(values, dtype=np.float64) for name, values in token_stats.items()}
            if prompt_values is not None:
                shares = prompt_values[index, start:longest].astype(np.float64)
                stats.update(zip(context.prompt_statistic_names, shares.T, strict=True))
            traces.append(
                TokenTrace(
                    token_ids=response,
                    stats=stats,
                    attention=None if rows is None else np.ascontiguousarray(rows[index, start:longest]),
                )
            )
        return traces


def _empty_trace(context: DecodeContext) -> TokenTrace:
    return TokenTrace(
        token_ids=(),
        stats={name: np.zeros(0) for name in context.statistic_names},
        attention=None if not context.capturing else np.zeros((0, 0, 0, context.n_lags + 1), dtype=np.float32),
    )
