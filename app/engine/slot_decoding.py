"""Continuous batching over a slot cache, each decode step one CUDA graph replay.

A decode step of the eager `DecodeBatch` launches hundreds of small kernels from Python (per layer:
norms, projections, rotary, attention, capture); on a GPU the host cannot launch them as fast as the
device runs them, so the step is bound by the host. Here the whole step (the forward, the attention
capture's window weights, the log-softmax, the greedy choice and its statistics, the advance of every
slot's position) is captured once as a CUDA graph and replayed: one launch per step. What a graph needs
is tensors that never move, which the slot cache gives (`app/engine/slot_cache.py`): finished rows free
their slot, newly prefilled rows are copied into free slots, and the same graph replays whatever rows
hold what.

One graph per read width (128, 256, ... up to the slot length): a step reads only as many columns as
its longest sequence needs. Every slot is computed at every step, running or empty (on a GPU a decode
step reads the same weights whatever the batch, so empty rows cost little). A sequence that would
outgrow its slot finishes with reason `length`.

Host work left per step: the rows' last tokens in, the chosen tokens, statistics and attention rows out,
and what `DecodeBatch` does with them (stop tokens, stop strings, sampling of non-greedy rows). On a CPU
the same step runs eagerly (no graph), which is what the tests compare against `DecodeBatch`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from app.engine import phase_timing
from app.engine.batch_cache import padding_mask_suffices
from app.engine.decoding import DecodeBatch, DecodeContext, QueuedChoice
from app.engine.sequence import FinishReason, SequenceState
from app.engine.slot_cache import SlotCache
from app.engine.token_stats import token_stats_tensor

logger = logging.getLogger(__name__)

SMALLEST_WIDTH = 128


def slot_decoding_refusal(context: DecodeContext) -> str | None:
    """Why this model cannot decode over a slot cache (None: it can)."""
    if not padding_mask_suffices(context.model):
        return "its layers need more than a causal and padding mask (sliding windows, token types)"
    devices = {parameter.device for parameter in context.model.parameters()}
    if len(devices) > 1:
        return "it is spread over several devices"
    return None


@dataclass(frozen=True)
class _StepOutputs:
    """What one step leaves on the device for every slot (a graph's static outputs: the next replay overwrites them)."""

    logits: torch.Tensor  # [slots, vocab]
    argmax: torch.Tensor  # [slots]
    log_probs: torch.Tensor  # [slots, vocab] float32
    stats: torch.Tensor  # [statistics, slots] of the argmax tokens
    rows: torch.Tensor | None  # [slots, 1, layers, heads, n_lags + 1] attention rows


class SlotDecodeBatch(DecodeBatch):
    """Sequences in the slots of a `SlotCache`; `merge` takes in prefilled rows, `pop_done` frees slots."""

    def __init__(self, context: DecodeContext, slots: int, max_length: int, cuda_graphs: bool) -> None:
        refusal = slot_decoding_refusal(context)
        if refusal is not None:
            raise ValueError(f"this model cannot decode over a slot cache: {refusal}")
        self.context = context
        self.sequences: list[SequenceState] = []
        self.slot_of: list[int] = []  # each sequence's slot
        self.slot_cache = SlotCache(context.model, slots, max_length)
        self.cache = self.slot_cache  # type: ignore[assignment]  # DecodeBatch's name for the batch's cache
        device = self.slot_cache.positions.device
        self.tokens = torch.full((slots, 1), context.pad_token_id, dtype=torch.long, device=device)
        self.lengths = [0] * slots  # host copy of each slot's position: its sequence's length so far
        self.padded = False
        self.cuda_graphs = cuda_graphs and device.type == "cuda"
        self._free = list(range(slots - 1, -1, -1))  # popped from the end: the lowest free slot first
        self._columns = torch.arange(max_length, device=device)
        self._lags = torch.arange(context.n_lags, -1, -1, device=device)  # a window's columns, oldest first
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, _StepOutputs]] = {}
        self._pool: Any = None  # the graphs' shared memory pool, once the first is captured
        self._order: torch.Tensor | slice | None = None  # the sequences' slots, as an index (None: not built)
        self._dtype = next(context.model.parameters()).dtype

    # ------------------------------------------------------------------ the captured step
    def _body(self, width: int) -> _StepOutputs:
        """One step for every slot, reading `width` columns; only tensor operations (what a graph records)."""
        cache, context = self.slot_cache, self.context
        cache.view_length = width
        positions = cache.positions
        hidden = self._columns[None, :width] > positions[:, None]
        mask = torch.zeros(hidden.shape, dtype=self._dtype, device=hidden.device).masked_fill_(hidden, -torch.inf)
        capture = context.new_capture()
        if capture is not None:
            columns = positions[:, None] - self._lags[None, :]
            window = torch.zeros(columns.shape, dtype=torch.float32, device=columns.device)
            capture.window_mask = window.masked_fill_(columns < 0, -torch.inf)[:, None, None, :]
            # An empty slot's position may pass the width; its window is read and never used.
            capture.key_columns = columns.clamp(min=0, max=width - 1)
        logits = context.model(
            input_ids=self.tokens,
            attention_mask=mask[:, None, None, :],
            position_ids=positions[:, None],
            past_key_values=cache,
            use_cache=True,
            tad_capture=capture,
            logits_to_keep=1,
        ).logits[:, -1, :]
        rows = capture.stacked_on_device() if capture is not None else None
        argmax = torch.argmax(logits, dim=-1)
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        stats = token_stats_tensor(log_probs, argmax)
        positions.add_(1).clamp_(max=cache.max_length - 1)
        return _StepOutputs(logits, argmax, log_probs, stats, rows)

    def _capture(self, width: int) -> tuple[torch.cuda.CUDAGraph, _StepOutputs]:
        """The step at `width` as a CUDA graph, after one eager warm-up on a side stream (kernels pick their
        algorithms, the allocator settles). The warm-up writes the slots' current keys, which the replay that
        follows writes again identically; the positions it advanced are put back."""
        positions = self.slot_cache.positions
        saved = positions.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            self._body(width)
        torch.cuda.current_stream().wait_stream(stream)
        positions.copy_(saved)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            outputs = self._body(width)
        self._pool = graph.pool()
        logger.info("captured the decode step as a CUDA graph (%d slots, width %d)", len(self.lengths), width)
        return graph, outputs

    def _run(self, width: int) -> _StepOutputs:
        if not self.cuda_graphs:
            with torch.inference_mode():
                return self._body(width)
        captured = self._graphs.get(width)
        if captured is None:
            captured = self._graphs[width] = self._capture(width)
        captured[0].replay()
        return captured[1]

    def _width(self) -> int:
        """The narrowest read width that holds every running sequence's next column."""
        needed = max(self.lengths[slot] for slot in self.slot_of) + 1
        width = SMALLEST_WIDTH
        while width < needed:
            width *= 2
        return min(width, self.slot_cache.max_length)

    # ------------------------------------------------------------------ stepping
    def step(self) -> None:
        """Feed every sequence its last token: record that token's attention row, choose the next."""
        sequences = self.sequences
        if not sequences:
            return
        pad = self.context.pad_token_id
        inputs = [pad] * len(self.lengths)
        for seq, slot in zip(sequences, self.slot_of, strict=True):
            inputs[slot] = seq.tokens[-1].token_id if seq.tokens else pad
        self.tokens.copy_(torch.tensor(inputs, dtype=torch.long).view(-1, 1))
        clock = phase_timing.CLOCK
        if clock is not None:
            clock.decode_steps += 1
            clock.decode_rows += len(sequences)
            clock.lap(phase_timing.SCHEDULER)
        outputs = self._run(self._width())
        for slot in self.slot_of:
            self.lengths[slot] += 1
        if clock is not None:
            clock.lap(phase_timing.FORWARD)
        order = self._sequence_order()
        active = [index for index, seq in enumerate(sequences) if seq.finish_reason is None]
        every_row_greedy = len(active) == len(sequences) and all(seq.request.params.greedy for seq in sequences)
        argmax = outputs.argmax[order]
        queued = QueuedChoice(argmax, outputs.log_probs[order], outputs.stats[:, order] if every_row_greedy else None)
        greedy = argmax.tolist()
        if clock is not None:
            clock.lap(phase_timing.SAMPLING)
        if outputs.rows is not None:
            rows = outputs.rows[order][:, 0].cpu().numpy()
            for index, seq in enumerate(sequences):
                if len(seq.attention_rows) < len(seq.tokens) and not seq.abandoned:
                    seq.attention_rows.append(rows[index])
            if clock is not None:
                clock.lap(phase_timing.CAPTURE)
        if active:
            self._choose_next(outputs.logits[order], active, queued, greedy)
        limit = self.slot_cache.max_length - 2  # room for the last token's own row
        for seq, slot in zip(sequences, self.slot_of, strict=True):
            if seq.finish_reason is None and self.lengths[slot] >= limit:
                seq.finish(FinishReason.LENGTH)

    def _sequence_order(self) -> torch.Tensor | slice:
        """Index of the sequences' slots into a step's outputs (a slice, no copy, when they hold slots 0..n-1)."""
        if self._order is None:
            if self.slot_of == list(range(len(self.slot_of))):
                self._order = slice(0, len(self.slot_of))
            else:
                self._order = torch.tensor(self.slot_of, dtype=torch.long, device=self.tokens.device)
        return self._order

    # ------------------------------------------------------------------ membership
    def clear(self) -> None:
        """Every slot free (after a failure dropped the running sequences); the captured graphs stay valid."""
        self.sequences, self.slot_of, self._order = [], [], None
        self.lengths = [0] * len(self.lengths)
        self._free = list(range(len(self.lengths) - 1, -1, -1))

    def _select(self, keep: list[int]) -> None:
        if len(keep) == len(self.sequences):
            return
        kept = set(keep)
        freed = [slot for index, slot in enumerate(self.slot_of) if index not in kept]
        self.sequences = [self.sequences[i] for i in keep]
        self.slot_of = [self.slot_of[i] for i in keep]
        for slot in freed:
            self.lengths[slot] = 0
        self._free = sorted([*self._free, *freed], reverse=True)
        self._order = None

    def merge(self, other: DecodeBatch) -> None:
        """Take in the rows of a just-prefilled `DecodeBatch` (left-padded cache): each into a free slot."""
        if not other.sequences:
            return
        cache = self.slot_cache
        rows = len(other.sequences)
        if rows > len(self._free):
            raise RuntimeError(f"{rows} rows to merge, {len(self._free)} free slots")
        lengths = other.positions.to(self.tokens.device)
        lengths_host = lengths.tolist()
        width = int(other.attention_mask.shape[1])
        if width > cache.max_length - 2:
            raise ValueError(f"a prompt of {width} tokens does not fit a slot of {cache.max_length}")
        slots = [self._free.pop() for _ in range(rows)]
        layers: list[Any] = list(other.cache.layers)  # a prefill's DynamicCache: keys and values per layer
        cache.place(
            torch.tensor(slots, dtype=torch.long, device=self.tokens.device),
            [layer.keys for layer in layers],
            [layer.values for layer in layers],
            lengths,
        )
        for slot, length in zip(slots, lengths_host, strict=True):
            self.lengths[slot] = int(length)
        self.sequences = self.sequences + other.sequences
        self.slot_of = self.slot_of + slots
        self._order = None
