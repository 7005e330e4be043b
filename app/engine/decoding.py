"""A batch of sequences decoded together, one token per step, with attention capture.

Sequences are left-padded so that every row ends at the same column; each row has its own
position ids, so a sequence computes the same thing whatever its neighbours. Batches can
lose finished rows and take in newly prefilled ones between steps (continuous batching):
the key/value caches are left-padded to a common length and concatenated.

A sliding-window cache layer (Mistral, Gemma-2/3) holds only the last `window - 1` keys of
the batch's columns and counts every column it has seen (`cumulative_length`), from which
transformers places its window in the attention mask: merging and trimming keep both in
step with the mask (`app/engine/batch_cache.py`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from app.engine import phase_timing
from app.engine.attention_capture import AttentionCapture
from app.engine.batch_cache import merge_layer, trim_layer
from app.engine.detokenizer import decode_text, final_text, find_stop_string
from app.engine.prefix_text import PrefixText
from app.engine.sampling import choose_token, make_generator, top_alternatives
from app.engine.sequence import FinishReason, GenerationRequest, SequenceState, TokenRecord
from app.engine.token_stats import compute_token_stats, stats_by_name, token_stats_tensor

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodeContext:
    """What every batch needs from the engine."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    n_lags: int  # 0 disables attention capture
    stop_token_ids: frozenset[int]
    pad_token_id: int
    num_layers: int
    allow_fused_kernel: bool = True
    last_row: bool = True  # compute the last token's own step row (the consuming convention needs it)
    # A decode step's attention mask is its padding alone (`padding_mask_suffices`): the step passes it
    # ready-made instead of having transformers build it from the 2-D mask on every forward.
    step_mask_from_padding: bool = False

    @property
    def capturing(self) -> bool:
        return self.n_lags > 0

    @property
    def decoder(self) -> torch.nn.Module:
        """The model without its output head (the whole model if it does not expose one)."""
        get_decoder = getattr(self.model, "get_decoder", None)
        decoder = get_decoder() if callable(get_decoder) else None
        return decoder if isinstance(decoder, torch.nn.Module) else self.model

    def new_capture(self, query_start: int = 0) -> AttentionCapture | None:
        if not self.capturing:
            return None
        return AttentionCapture(
            n_lags=self.n_lags,
            num_layers=self.num_layers,
            query_start=query_start,
            allow_fused_kernel=self.allow_fused_kernel,
        )


def left_pad(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids `[batch, width]` right-aligned, and the matching 0/1 attention mask."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        if row:
            ids[index, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[index, width - len(row) :] = 1
    return ids, mask


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 at each row's first real token (as transformers' generate does)."""
    positions = mask.long().cumsum(-1) - 1
    return positions.masked_fill(mask == 0, 1)


class ChunkedColumns:
    """Left-padded token rows run through the model a chunk of columns at a time, into one cache.

    Each chunk attends to the columns before it through the cache, so running the rows in chunks
    equals one forward to float rounding: what lets a long prompt's prefill or scoring pass run
    between the decode steps of answers already streaming.
    """

    def __init__(self, context: DecodeContext, rows: Sequence[Sequence[int]]) -> None:
        self.context = context
        ids, mask = left_pad(rows, context.pad_token_id)
        self.ids, self.mask = ids.to(context.device), mask.to(context.device)
        self.positions = positions_from_mask(self.mask)
        self.cache = DynamicCache(config=context.model.config)
        self.done = 0  # columns already in the cache

    @property
    def width(self) -> int:
        return int(self.ids.shape[1])

    def chunk_end(self, max_tokens: int | None, stop: int) -> int:
        """Where the next chunk of at most `max_tokens` tokens (at least one column; None: no limit) ends,
        going no further than column `stop`."""
        if max_tokens is None:
            return stop
        return min(stop, self.done + max(1, max_tokens // self.ids.shape[0]))

    def inputs(self, end: int) -> dict[str, Any]:
        """The model's inputs for columns `done`..`end`."""
        return {
            "input_ids": self.ids[:, self.done : end],
            "attention_mask": self.mask[:, :end],
            "position_ids": self.positions[:, self.done : end],
            "past_key_values": self.cache,
            "use_cache": True,
        }

    def fill(self, end: int) -> None:
        """Columns `done`..`end` into the cache, without the output head (nothing is read from them)."""
        with torch.inference_mode():
            self.context.decoder(**self.inputs(end))
        self.done = end
        if (clock := phase_timing.CLOCK) is not None:
            clock.lap(phase_timing.PREFILL)


class PromptPrefill:
    """Prompts run through the model a chunk of columns at a time (chunked prefill, `ChunkedColumns`);
    the last chunk chooses every sequence's first token."""

    def __init__(self, context: DecodeContext, requests: Sequence[GenerationRequest]) -> None:
        if not requests:
            raise ValueError("nothing to prefill")
        self.context = context
        self.requests = list(requests)
        self.columns = ChunkedColumns(context, [request.prompt_ids for request in self.requests])

    def advance(self, max_tokens: int | None = None) -> DecodeBatch | None:
        """Run the next chunk of at most `max_tokens` tokens (at least one column; None: all that
        is left); once the last column has run, the batch with every sequence's first token."""
        columns, context = self.columns, self.context
        if columns.done == columns.width:
            raise RuntimeError("this prefill is already done")
        end = columns.chunk_end(max_tokens, columns.width)
        if end < columns.width:
            columns.fill(end)
            return None
        with torch.inference_mode():
            logits = context.model(**columns.inputs(end), logits_to_keep=1).logits[:, -1, :]
        columns.done = end
        if (clock := phase_timing.CLOCK) is not None:
            clock.lap(phase_timing.PREFILL)
        sequences = [
            SequenceState(
                request=r, generator=make_generator(r.params), wants_rows=context.capturing, last_row=context.last_row
            )
            for r in self.requests
        ]
        padded = len({len(request.prompt_ids) for request in self.requests}) > 1  # known here without a device sync
        batch = DecodeBatch(context, sequences, columns.cache, columns.mask, columns.mask.long().sum(-1), padded)
        active = list(range(len(sequences)))
        batch._choose_next(logits, active, batch._queue_choice(logits, active))
        return batch


@dataclass(frozen=True)
class QueuedChoice:
    """What choosing a step's tokens computes on the device before anything is read (`_queue_choice`)."""

    argmax: torch.Tensor  # [rows]
    log_probs: torch.Tensor  # [rows, vocab] float32: the raw distribution
    stats: torch.Tensor | None  # [statistics, rows] of the argmax tokens: when every row is active and greedy


class DecodeBatch:
    """Sequences that advance together; see the module docstring."""

    def __init__(
        self,
        context: DecodeContext,
        sequences: list[SequenceState],
        cache: DynamicCache,
        attention_mask: torch.Tensor,
        positions: torch.Tensor,
        padded: bool | None = None,
    ) -> None:
        """`padded`: whether any row of `attention_mask` has padding (None: read from the mask)."""
        self.context = context
        self.sequences = sequences
        self.cache = cache
        self.attention_mask = attention_mask
        self.positions = positions  # position id of each row's next input token
        self.padded = bool((attention_mask == 0).any()) if padded is None else padded

    # ------------------------------------------------------------------ creation
    @classmethod
    def prefill(cls, context: DecodeContext, requests: Sequence[GenerationRequest]) -> DecodeBatch:
        """Run the prompts in one forward and choose every sequence's first token."""
        batch = PromptPrefill(context, requests).advance()
        assert batch is not None
        return batch

    # ------------------------------------------------------------------ stepping
    def step(self) -> None:
        """Feed every row its last token: record that token's attention row, choose the next."""
        sequences = self.sequences
        size = len(sequences)
        pad = self.context.pad_token_id
        inputs = torch.tensor(
            [seq.tokens[-1].token_id if seq.tokens else pad for seq in sequences],
            dtype=torch.long,
            device=self.context.device,
        ).view(size, 1)
        # One kernel: the new column of ones appended in the copy that grows the mask.
        self.attention_mask = torch.nn.functional.pad(self.attention_mask, (0, 1), value=1)
        capture = self.context.new_capture()
        active = [index for index, seq in enumerate(sequences) if seq.finish_reason is None]
        step_mask: torch.Tensor | None = self.attention_mask
        if self.context.step_mask_from_padding:
            # What `create_causal_mask` would build for one query: None without padding, else the padding.
            step_mask = self.attention_mask[:, None, None, :].bool() if self.padded else None
        inputs_kwargs = {
            "input_ids": inputs,
            "attention_mask": step_mask,
            "position_ids": self.positions.view(size, 1),
            "past_key_values": self.cache,
            "use_cache": True,
            "tad_capture": capture,
        }
        clock = phase_timing.CLOCK
        if clock is not None:
            clock.decode_steps += 1
            clock.decode_rows += size
            clock.lap(phase_timing.SCHEDULER)
        with torch.inference_mode():
            if active:
                logits = self.context.model(**inputs_kwargs, logits_to_keep=1).logits[:, -1, :]
            else:
                # Only last-token attention rows are wanted: skip the output head (a fifth of a
                # small model's compute), since no next token will be chosen.
                self.context.decoder(**inputs_kwargs)
        self.positions = self.positions + 1
        if clock is not None:
            clock.lap(phase_timing.FORWARD)
        # The choices' statistics and the rows' kernels are queued before the greedy choices are read: the
        # step waits for the device once, and the rest is then already computed when it is copied.
        queued = self._queue_choice(logits, active) if active else None
        if clock is not None:
            clock.lap(phase_timing.TOKEN_STATS)
        rows_on_device = capture.stacked_on_device() if capture is not None else None
        if clock is not None:
            clock.lap(phase_timing.CAPTURE)
        greedy = queued.argmax.tolist() if queued is not None else []
        if clock is not None:
            clock.lap(phase_timing.SAMPLING)
        if rows_on_device is not None:
            rows = rows_on_device[:, 0].cpu().numpy()
            for index, seq in enumerate(sequences):
                if len(seq.attention_rows) < len(seq.tokens) and not seq.abandoned:
                    seq.attention_rows.append(rows[index])
            if clock is not None:
                clock.lap(phase_timing.CAPTURE)
        if queued is not None:
            self._choose_next(logits, active, queued, greedy)

    def _queue_choice(self, logits: torch.Tensor, active: list[int]) -> QueuedChoice:
        """The step's argmax and raw distribution, and, when every row is active and greedy (the usual case),
        the statistics of the argmax tokens: all queued on the device, none read yet."""
        argmax = torch.argmax(logits, dim=-1)
        # The raw distribution (`RawDistribution.from_logits`): every statistic reads it, never sampling's.
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        sequences = self.sequences
        every_row_greedy = len(active) == len(sequences) and all(seq.request.params.greedy for seq in sequences)
        stats = token_stats_tensor(log_probs, argmax) if every_row_greedy else None
        return QueuedChoice(argmax, log_probs, stats)

    def _choose_next(
        self, logits: torch.Tensor, active: list[int], queued: QueuedChoice, greedy: list[int] | None = None
    ) -> None:
        """Choose the next token of rows `active` (ascending) and record it with its statistics; `greedy`: each
        row's argmax when the caller has read it already.

        Runs once per step for the whole batch, so it keeps to one pass per statistic over the batch's
        raw distribution and plain Python per row: no copy of the distribution's rows when every row
        is active, no per-row work for options a request did not ask for.
        """
        clock = phase_timing.CLOCK
        log_probs = queued.log_probs
        if greedy is None:
            greedy = queued.argmax.tolist()
        if queued.stats is not None:  # every row active and greedy: the argmax tokens' statistics are queued
            self._record(active, greedy, log_probs, stats_by_name(queued.stats))
            return
        sequences = self.sequences
        chosen: list[int] = []
        kept: list[int] = []
        for index in active:
            seq = sequences[index]
            params = seq.request.params
            if params.greedy:
                chosen.append(greedy[index])
                kept.append(index)
                continue
            try:
                chosen.append(choose_token(logits[index], params, seq.generator))
            except RuntimeError:
                logger.exception("choosing a token failed; ending that sequence only")
                seq.abandon(FinishReason.ERROR)
                continue
            kept.append(index)
        if not kept:
            return
        if clock is not None:
            clock.lap(phase_timing.SAMPLING)
        rows = log_probs if len(kept) == log_probs.shape[0] else log_probs[torch.tensor(kept, device=logits.device)]
        stats = compute_token_stats(rows, torch.tensor(chosen, device=logits.device))
        if clock is not None:
            clock.lap(phase_timing.TOKEN_STATS)
        self._record(kept, chosen, log_probs, stats)

    def _record(
        self,
        kept: list[int],
        chosen: list[int],
        log_probs: torch.Tensor,
        stats: dict[str, list[float]],
        sequences: list[SequenceState] | None = None,
    ) -> None:
        """Each kept row's chosen token (by position in `kept`) with its statistics; stop tokens and lengths.
        `kept` indexes `sequences` (default: the batch's)."""
        clock = phase_timing.CLOCK
        sequences = self.sequences if sequences is None else sequences
        names = tuple(stats)
        per_token = list(zip(*stats.values(), strict=True))
        stop_ids = self.context.stop_token_ids
        for position, index in enumerate(kept):
            seq, token = sequences[index], chosen[position]
            if token in stop_ids:
                seq.ended_on_stop_token = True
                seq.finish(FinishReason.STOP)
                continue
            params = seq.request.params
            alternatives = tuple(top_alternatives(log_probs[index], params.top_logprobs)) if params.top_logprobs else ()
            seq.tokens.append(
                TokenRecord(
                    token_id=token, stats=dict(zip(names, per_token[position], strict=True)), top_logprobs=alternatives
                )
            )
            if params.stop and self._hit_stop_string(seq):
                continue
            if len(seq.tokens) >= params.max_new_tokens:
                seq.finish(FinishReason.LENGTH)
        if clock is not None:
            clock.lap(phase_timing.SAMPLING)

    def _hit_stop_string(self, seq: SequenceState) -> bool:
        """Finish at the first stop string; keep the tokens that make up the text before it."""
        # Bound to the tokenizer, not to this batch: the prefill's batch (and its cache) must not live on with it.
        seq.stop_search_text = seq.stop_search_text or PrefixText(partial(decode_text, self.context.tokenizer))
        hit = find_stop_string(seq.stop_search_text, seq.token_ids(), seq.params.stop)
        if hit is None:
            return False
        seq.stop_text_end = hit.text_end
        seq.finish(FinishReason.STOP, n_kept=hit.n_kept)
        return True

    # ------------------------------------------------------------------ membership
    def pop_done(self) -> list[SequenceState]:
        """Remove and return sequences that are finished and need no more rows."""
        if all(seq.finish_reason is None for seq in self.sequences):  # most steps: nobody finished
            return []
        done = [seq for seq in self.sequences if seq.finished and not seq.needs_final_row]
        if not done:
            return []
        for seq in done:
            self._finalise_text(seq)
        keep = [i for i, seq in enumerate(self.sequences) if not (seq.finished and not seq.needs_final_row)]
        self._select(keep)
        return done

    def _finalise_text(self, seq: SequenceState) -> None:
        seq.text = final_text(partial(decode_text, self.context.tokenizer), seq)
        seq.text_final = True
        del seq.attention_rows[seq.n_kept :]

    def _select(self, keep: list[int]) -> None:
        if len(keep) == len(self.sequences):
            return
        self.sequences = [self.sequences[i] for i in keep]
        if not keep:
            self.cache = DynamicCache(config=self.context.model.config)
            self.attention_mask = self.attention_mask[:0]
            self.positions = self.positions[:0]
            self.padded = False
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.attention_mask.device)
        self.attention_mask = self.attention_mask.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        # Columns that are padding in every remaining row cost compute and hold nothing.
        real_columns = self.attention_mask.any(dim=0).nonzero()
        first = int(real_columns[0].item()) if len(real_columns) else 0
        self.attention_mask = self.attention_mask[:, first:]
        self.padded = bool((self.attention_mask == 0).any())
        for layer in self.cache.layers:
            trim_layer(layer, index, first)

    def merge(self, other: DecodeBatch) -> None:
        """Take in the rows of another batch (typically just prefilled)."""
        if not other.sequences:
            return
        if not self.sequences:
            self.sequences, self.cache = other.sequences, other.cache
            self.attention_mask, self.positions, self.padded = other.attention_mask, other.positions, other.padded
            return
        mine, theirs = self.attention_mask.shape[1], other.attention_mask.shape[1]
        width = max(mine, theirs)
        for own, new in zip(self.cache.layers, other.cache.layers, strict=True):
            merge_layer(own, new, mine, theirs)
        self.attention_mask = torch.cat(
            [
                torch.nn.functional.pad(self.attention_mask, (width - mine, 0)),
                torch.nn.functional.pad(other.attention_mask, (width - theirs, 0)),
            ]
        )
        self.positions = torch.cat([self.positions, other.positions])
        self.padded = self.padded or other.padded or mine != theirs
        self.sequences = self.sequences + other.sequences

    def __len__(self) -> int:
        return len(self.sequences)


def run_to_completion(context: DecodeContext, requests: Sequence[GenerationRequest]) -> list[SequenceState]:
    """Generate every request in one batch; results in request order."""
    if not requests:
        return []
    batch = DecodeBatch.prefill(context, requests)
    sequences = list(batch.sequences)
    batch.pop_done()
    while batch.sequences:
        batch.step()
        batch.pop_done()
    return sequences


def run_continuously(
    context: DecodeContext, requests: Sequence[GenerationRequest], max_batch: int, min_join: int = 1
) -> Iterator[tuple[int, SequenceState]]:
    """Generate every request with at most `max_batch` rows decoding at once, as the server does:
    a finished row leaves at once and waiting requests join (prefilled together) once at least
    `min_join` rows are free, or all that still wait. Yields (request index, finished sequence)
    in the order they finish.

    A static batch waits for its longest answer; here a short answer's row is refilled, which is
    what makes offline generation of mixed-length answers cheaper. Each join copies the batch's
    caches once (`DecodeBatch.merge`), so `min_join` trades that copy against idle rows.
    """
    if max_batch < 1 or not 1 <= min_join <= max_batch:
        raise ValueError(f"need 1 <= min_join <= max_batch, got min_join={min_join}, max_batch={max_batch}")
    waiting = deque(enumerate(requests))
    batch: DecodeBatch | None = None
    index_of: dict[int, int] = {}  # id(sequence) -> its request's index
    while True:
        for sequence in batch.pop_done() if batch is not None else ():
            yield index_of.pop(id(sequence)), sequence
        free = max_batch - (len(batch) if batch is not None else 0)
        if waiting and free >= min(min_join, len(waiting)):
            joining = [waiting.popleft() for _ in range(min(free, len(waiting)))]
            joined = DecodeBatch.prefill(context, [request for _, request in joining])
            index_of.update({id(seq): index for (index, _), seq in zip(joining, joined.sequences, strict=True)})
            if batch is None:
                batch = joined
            else:
                batch.merge(joined)
            continue  # a row may have finished at its first token
        if batch is None or not len(batch):
            return
        batch.step()
