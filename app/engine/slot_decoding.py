"""Continuous batching over a slot cache, each decode step compiled: a CUDA graph replay, or inductor's code.

A decode step of the eager `DecodeBatch` launches hundreds of small kernels from Python (per layer:
norms, projections, rotary, attention, capture); the host cannot launch them as fast as a GPU runs
them, and on a CPU with a small model the Python around the kernels is most of the step. Here the
whole step (the forward, the attention capture's window weights, the log-softmax, the greedy choice
and its statistics, the advance of every slot's position) is compiled: on CUDA captured once as a
CUDA graph and replayed (one launch per step); on a CPU compiled by `torch.compile` (inductor fuses
the small operations into C++ loops and calls them from generated C++, with no Python between them
and no guard checked before them: `_compiled_step`). Both need tensors that never
move, which the slot cache gives (`app/engine/slot_cache.py`): finished rows free their slot, newly
prefilled rows are copied into free slots, and the same graph or code runs whatever rows hold what.

One graph (or compiled program) per read width (128, 256, ... up to the slot length), all built by
`warm_up` before the first request: a step reads only as many columns as its longest sequence needs.
Every slot is computed at every step, running or empty. A sequence that would outgrow its slot
finishes with reason `length`.

Host work left per step: the rows' last tokens in, the chosen tokens, statistics and attention rows out,
and what `DecodeBatch` does with them (stop tokens, stop strings, sampling of non-greedy rows). On CUDA,
while every row is greedy, that work overlaps the next step: the graph leaves each row's argmax as its
next input and the next replay is queued before this step's results are read (lookahead, `step`).
Uncompiled, the same step runs eagerly, which is what the tests compare against `DecodeBatch`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from app.engine import phase_timing
from app.engine.attention_capture import reversed_slots
from app.engine.batch_cache import padding_mask_suffices
from app.engine.decoding import DecodeBatch, DecodeContext, QueuedChoice
from app.engine.sequence import FinishReason, SequenceState
from app.engine.slot_cache import SlotCache
from app.engine.token_stats import stats_by_name, token_stats_tensor

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


@dataclass
class _HostBuffers:
    """Where a step's greedy results are copied for the host to read (pinned on a GPU, so the copy is async)."""

    argmax: torch.Tensor
    stats: torch.Tensor
    rows: torch.Tensor | None

    @classmethod
    def like(cls, outputs: _StepOutputs, pinned: bool) -> _HostBuffers:
        def empty(tensor: torch.Tensor) -> torch.Tensor:
            return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinned)

        return cls(empty(outputs.argmax), empty(outputs.stats), None if outputs.rows is None else empty(outputs.rows))


@dataclass
class _Launched:
    """One step run or queued: the sequences and slots it computed, each slot's length after it, its outputs."""

    sequences: list[SequenceState]
    slots: list[int]
    lengths: list[int]
    outputs: _StepOutputs
    host: _HostBuffers | None = None
    ready: torch.cuda.Event | None = None

    def copy_for_host(self, buffers: _HostBuffers) -> None:
        """Queue the copies of the argmax, statistics and rows into `buffers` (before any later step is queued)."""
        self.host = buffers
        buffers.argmax.copy_(self.outputs.argmax, non_blocking=True)
        buffers.stats.copy_(self.outputs.stats, non_blocking=True)
        if buffers.rows is not None and self.outputs.rows is not None:
            buffers.rows.copy_(self.outputs.rows, non_blocking=True)
        if self.outputs.argmax.device.type == "cuda":
            self.ready = torch.cuda.Event()
            self.ready.record()

    def read(self, index: torch.Tensor | slice) -> tuple[list[int], torch.Tensor, np.ndarray | None]:
        """The copied argmax, statistics `[statistics, rows]` and attention rows of `index`, once they have landed."""
        assert self.host is not None
        if self.ready is not None:
            self.ready.synchronize()  # the copies only: a step queued after them keeps running
        host = self.host
        # Copied out: the buffers are written again two steps later, and the rows stay with their sequences.
        rows = host.rows[index][:, 0].numpy().copy() if host.rows is not None else None
        return host.argmax[index].tolist(), host.stats[:, index], rows


def _read_on_host(seq: SequenceState) -> bool:
    """A row whose step results are its argmax and statistics alone: greedy, no alternatives asked for."""
    return seq.request.params.greedy and not seq.request.params.top_logprobs


class SlotDecodeBatch(DecodeBatch):
    """Sequences in the slots of a `SlotCache`; `merge` takes in prefilled rows, `pop_done` frees slots."""

    def __init__(
        self, context: DecodeContext, slots: int, max_length: int, compiled: bool, lookahead: bool | None = None
    ) -> None:
        """`compiled`: the step a CUDA graph on CUDA, compiled by `torch.compile` on a CPU (else eager);
        `lookahead`: queue the next step before reading this one's results while every row is greedy (`step`);
        default: with CUDA graphs."""
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
        self.cuda_graphs = compiled and device.type == "cuda"
        # On a CPU, one compiled program per width (`_compiled_step`); `warm_up` builds them all.
        self.compiled_on_cpu = compiled and device.type == "cpu"
        self._compiled: dict[int, Callable[[], _StepOutputs]] = {}
        self._free = list(range(slots - 1, -1, -1))  # popped from the end: the lowest free slot first
        self._columns = torch.arange(max_length, device=device)
        self._lags = torch.arange(context.n_lags, -1, -1, device=device)  # a window's columns, oldest first
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, _StepOutputs]] = {}
        self._pool: Any = None  # the graphs' shared memory pool, once the first is captured
        self._order: torch.Tensor | None = None  # `_order_slots` as a device index (None: not built)
        self._dtype = next(context.model.parameters()).dtype
        self._order_slots: list[int] = []
        self.lookahead = self.cuda_graphs if lookahead is None else lookahead
        self._in_flight: _Launched | None = None  # a step queued ahead, its results not read yet
        self._buffers: list[_HostBuffers | None] = [None, None]
        self._buffer_turn = 0

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
        self.tokens.copy_(argmax.view(-1, 1))  # the next step's inputs, for greedy rows (lookahead)
        return _StepOutputs(logits, argmax, log_probs, stats, rows)

    def _capture(self, width: int) -> tuple[torch.cuda.CUDAGraph, _StepOutputs]:
        """The step at `width` as a CUDA graph, after one eager warm-up on a side stream (kernels pick their
        algorithms, the allocator settles). The warm-up writes the slots' current keys, which the replay that
        follows writes again identically; the positions it advanced and the inputs it replaced are put back."""
        positions = self.slot_cache.positions
        saved, saved_tokens = positions.clone(), self.tokens.clone()
        step = self._graph_step(width)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            step()
        torch.cuda.current_stream().wait_stream(stream)
        positions.copy_(saved)
        self.tokens.copy_(saved_tokens)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            outputs = step()
        self._pool = graph.pool()
        logger.info("captured the decode step as a CUDA graph (%d slots, width %d)", len(self.lengths), width)
        return graph, outputs

    def _graph_step(self, width: int) -> Callable[[], _StepOutputs]:
        """What `_capture` records at `width`: the step's eager kernels (`benchmarks/graph_decode.py` times
        inductor's fused ones recorded instead)."""
        return partial(self._body, width)

    def _compiled_step(self, width: int, cpp_wrapper: bool = True) -> Callable[[], _StepOutputs]:
        """The step at `width` compiled by inductor, its Python wrapper generated as C++ (`cpp_wrapper`: no
        Python call per kernel; off for code a CUDA graph records, which replays no wrapper), for this
        batch alone.

        torch.compile keeps compiled code per code object and, before each call, checks guards: that the
        model's modules, their parameters and the batch's tensors are still what the code was compiled
        for (about a thousand checks for a small model: a tenth of the tiny model's step). Nothing they
        check changes for this batch's life (the slot cache's tensors are written in place, the model is
        never swapped under an engine, the step always runs under `inference_mode`), so each width gets
        a code object of its own, whose one compiled program runs without guards."""

        def step() -> _StepOutputs:
            return self._body(width)

        step.__code__ = step.__code__.replace(co_name=f"decode_step_{width}")  # its own cache of compiled code
        # Built before tracing: a module-level cache the capture filled while being traced would be filled
        # again by the compiled code after every step (no guard to notice it is full).
        reversed_slots(self.context.n_lags + 1, self.tokens.device)
        options: dict[str, str | int | bool | Callable[..., Any]] = {
            "cpp_wrapper": cpp_wrapper,
            "guard_filter_fn": torch.compiler.skip_all_guards_unsafe,
        }
        return torch.compile(step, dynamic=False, fullgraph=True, options=options)

    def _run(self, width: int) -> _StepOutputs:
        if not self.cuda_graphs:
            with torch.inference_mode():
                if not self.compiled_on_cpu:
                    return self._body(width)
                step = self._compiled.get(width)
                if step is None:
                    step = self._compiled[width] = self._compiled_step(width)
                return step()
        captured = self._graphs.get(width)
        if captured is None:
            captured = self._graphs[width] = self._capture(width)
        captured[0].replay()
        return captured[1]

    def widths(self) -> list[int]:
        """Every read width a step can take: 128, 256, ... up to the slot length."""
        widths, width = [], SMALLEST_WIDTH
        while width < self.slot_cache.max_length:
            widths.append(width)
            width *= 2
        return [*widths, self.slot_cache.max_length]

    def warm_up(self) -> float:
        """Build the step of every width now (CUDA graphs captured, CPU programs compiled: seconds each), not
        when a request first reaches it; the slots must be empty. Returns the seconds it took."""
        if self.sequences:
            raise RuntimeError("warm_up needs empty slots")
        if not self.cuda_graphs and not self.compiled_on_cpu:
            return 0.0
        started = time.monotonic()
        widths = self.widths()
        positions = self.slot_cache.positions
        saved, saved_tokens = positions.clone(), self.tokens.clone()
        # On CUDA twice: the first pass captures each width's graph, the second replays it once before any request.
        for _ in range(2 if self.cuda_graphs else 1):
            for width in widths:
                self._run(width)
                positions.copy_(saved)  # the empty slots' keys it wrote are hidden by the mask until overwritten
                self.tokens.copy_(saved_tokens)
        seconds = time.monotonic() - started
        logger.info(
            "decode step compiled (%s) for %d slots, widths %s, in %.1f s",
            "CUDA graphs" if self.cuda_graphs else "torch.compile",
            len(self.lengths),
            widths,
            seconds,
        )
        return seconds

    def _width(self) -> int:
        """The narrowest read width that holds every running sequence's next column."""
        needed = max(self.lengths[slot] for slot in self.slot_of) + 1
        width = SMALLEST_WIDTH
        while width < needed:
            width *= 2
        return min(width, self.slot_cache.max_length)

    # ------------------------------------------------------------------ stepping
    def step(self) -> None:
        """Feed every sequence its last token: record that token's attention row, choose the next.

        With `lookahead`, while every running sequence is greedy (and asks for no alternatives), the next
        replay is launched before this one's results are read: the graph leaves each row's argmax as the
        next step's input, so the device runs step t + 1 while the host records step t. A row that ends at
        step t then has one step computed for nothing (its results are dropped; under the consuming
        convention it is the step that computes its last token's own row, which is kept, as the eager loop
        would compute it)."""
        launched = self._in_flight
        self._in_flight = None
        if launched is None:
            if not self.sequences:
                return
            launched = self._launch(inputs_from_host=True)
        if self.lookahead and self._all_greedy():
            self._in_flight = self._launch(inputs_from_host=False)
        self._record_launch(launched)

    def _all_greedy(self) -> bool:
        """Every running row still choosing, greedily: the next step's inputs are its argmax."""
        return bool(self.sequences) and all(seq.finish_reason is None and _read_on_host(seq) for seq in self.sequences)

    def _launch(self, inputs_from_host: bool) -> _Launched:
        """Run (or queue, on a GPU) one step for the running sequences; its results copied where the host reads
        them once they are ready (`_Launched.ready`). `inputs_from_host`: the rows' last tokens written from
        the host; else the previous replay's argmax already in place (and merged rows' first tokens)."""
        sequences, slots = list(self.sequences), list(self.slot_of)
        if inputs_from_host:
            pad = self.context.pad_token_id
            inputs = [pad] * len(self.lengths)
            for seq, slot in zip(sequences, slots, strict=True):
                inputs[slot] = seq.tokens[-1].token_id if seq.tokens else pad
            self.tokens.copy_(torch.tensor(inputs, dtype=torch.long).view(-1, 1))
        clock = phase_timing.CLOCK
        if clock is not None:
            clock.decode_steps += 1
            clock.decode_rows += len(sequences)
            clock.lap(phase_timing.SCHEDULER)
        outputs = self._run(self._width())
        for slot in slots:
            self.lengths[slot] += 1
        launched = _Launched(sequences, slots, [self.lengths[slot] for slot in slots], outputs)
        if all(_read_on_host(seq) for seq in sequences):
            launched.copy_for_host(self._host_buffers(outputs))
        if clock is not None:
            clock.lap(phase_timing.FORWARD)
        return launched

    def _record_launch(self, launched: _Launched) -> None:
        """What a step computed, into its sequences: attention rows, chosen tokens and their statistics."""
        clock = phase_timing.CLOCK
        sequences = launched.sequences
        active = [index for index, seq in enumerate(sequences) if seq.finish_reason is None]
        if launched.host is not None:  # every row greedy: its argmax, statistics and rows, copied to the host
            argmax, stats, rows = launched.read(self._index_of(launched.slots, on_host=True))
        else:  # the latest step, read on the device (sampling reads its logits)
            order = self._index_of(launched.slots, on_host=False)
            outputs = launched.outputs
            every_row_greedy = len(active) == len(sequences) and all(seq.request.params.greedy for seq in sequences)
            device_argmax = outputs.argmax[order]
            queued = QueuedChoice(
                device_argmax, outputs.log_probs[order], outputs.stats[:, order] if every_row_greedy else None
            )
            argmax = device_argmax.tolist()
            rows = outputs.rows[order][:, 0].cpu().numpy() if outputs.rows is not None else None
        if clock is not None:
            clock.lap(phase_timing.SAMPLING)
        if rows is not None:
            for index, seq in enumerate(sequences):
                wanted = seq.needs_final_row if seq.finished else len(seq.attention_rows) < len(seq.tokens)
                if wanted and not seq.abandoned:
                    seq.attention_rows.append(rows[index])
            if clock is not None:
                clock.lap(phase_timing.CAPTURE)
        if active and launched.host is not None:
            chosen = [argmax[index] for index in active]
            self._record(active, chosen, launched.outputs.log_probs, stats_by_name(stats[:, active]), sequences)
        elif active:
            self._choose_next(outputs.logits[order], active, queued, argmax)
        limit = self.slot_cache.max_length - 2  # room for the last token's own row
        for seq, length in zip(sequences, launched.lengths, strict=True):
            if seq.finish_reason is None and length >= limit:
                seq.finish(FinishReason.LENGTH)

    def _host_buffers(self, outputs: _StepOutputs) -> _HostBuffers:
        """One of two sets of host buffers, in turn: a step's results are read while the next step's are copied."""
        self._buffer_turn ^= 1
        buffers = self._buffers[self._buffer_turn]
        if buffers is None:
            pinned = self.tokens.device.type == "cuda"
            buffers = self._buffers[self._buffer_turn] = _HostBuffers.like(outputs, pinned)
        return buffers

    def _index_of(self, slots: list[int], on_host: bool) -> torch.Tensor | slice:
        """Index of `slots` into a step's outputs (a slice, no copy, when they are 0..n-1)."""
        if slots == list(range(len(slots))):
            return slice(0, len(slots))
        if on_host:
            return torch.tensor(slots, dtype=torch.long)
        if self._order is None or self._order_slots != slots:
            self._order = torch.tensor(slots, dtype=torch.long, device=self.tokens.device)
            self._order_slots = slots
        return self._order

    # ------------------------------------------------------------------ membership
    def clear(self) -> None:
        """Every slot free (after a failure dropped the running sequences); the captured graphs stay valid."""
        self.sequences, self.slot_of = [], []
        self._in_flight = None
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
        slot_index = torch.tensor(slots, dtype=torch.long, device=self.tokens.device)
        cache.place(
            slot_index,
            [layer.keys for layer in layers],
            [layer.values for layer in layers],
            lengths,
        )
        for slot, length in zip(slots, lengths_host, strict=True):
            self.lengths[slot] = int(length)
        pad = self.context.pad_token_id
        first = [seq.tokens[-1].token_id if seq.tokens else pad for seq in other.sequences]
        # Queued after any step in flight, whose graph leaves its argmax in every slot's input.
        self.tokens.index_copy_(0, slot_index, torch.tensor(first, dtype=torch.long).view(-1, 1).to(self.tokens.device))
        self.sequences = self.sequences + other.sequences
        self.slot_of = self.slot_of + slots
