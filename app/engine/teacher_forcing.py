"""Scoring a given answer with a teacher-forced forward pass (its prompt part in chunks if wanted).

For an answer the service generated itself, this reproduces the probabilities,
entropies and attention rows of generation (to float rounding): the prompt and answer
token ids are the same, and so are the positions and the capture convention.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from app.engine.decoding import ChunkedColumns, DecodeContext
from app.engine.sampling import RawDistribution
from app.engine.token_stats import TOKEN_STATISTICS
from app.uncertainty.trace import TokenTrace


def score_answers(context: DecodeContext, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[TokenTrace]:
    """Traces of each (prompt ids, answer ids) pair, computed in one left-padded batch."""
    traces = ScoringPass(context, pairs).advance()
    assert traces is not None
    return traces


class ScoringPass:
    """Teacher-forced scoring of a left-padded batch, the prompts' part runnable a chunk at a time.

    The last forward runs the answers' columns and the one before them (whose logits predict
    the first answer token), with capture; the columns before it only fill the cache, so they
    can run in chunks between decode steps, as a prompt's prefill does (`PromptPrefill`), with
    the same result to float rounding.
    """

    def __init__(self, context: DecodeContext, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> None:
        if any(len(prompt) == 0 for prompt, _ in pairs):
            raise ValueError("a prompt must have at least one token")
        self.context = context
        self.lengths = [len(answer) for _, answer in pairs]
        self.answers = [tuple(int(t) for t in answer) for _, answer in pairs]
        self.longest = max(self.lengths, default=0)
        self.done = not pairs or self.longest == 0
        if self.done:
            return
        self.columns = ChunkedColumns(context, [list(prompt) + list(answer) for prompt, answer in pairs])
        self.tail_start = self.columns.width - self.longest - 1  # >= 0: every prompt has a token

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
        """The columns left, rows captured for the answer columns only."""
        context, longest, columns = self.context, self.longest, self.columns
        capture = context.new_capture(query_start=self.tail_start + 1 - columns.done)
        with torch.inference_mode():
            output = context.model(**columns.inputs(columns.width), logits_to_keep=longest + 1, tad_capture=capture)
        self.done = True
        # logits[:, j] predicts the answer token at column tail_start + 1 + j.
        logits = output.logits[:, :-1, :]
        rows = capture.stacked().numpy() if capture is not None else None  # [b, longest, L, H, N + 1]
        traces = []
        for index, answer in enumerate(self.answers):
            count = self.lengths[index]
            if count == 0:
                traces.append(_empty_trace(context))
                continue
            start = longest - count
            distribution = RawDistribution.from_logits(logits[index, start:longest])
            targets = torch.tensor(list(answer), dtype=torch.long, device=distribution.log_probs.device)
            stats = distribution.token_stats(targets)
            traces.append(
                TokenTrace(
                    token_ids=answer,
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
