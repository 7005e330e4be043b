"""What the scheduler holds for each request, and how its events reach the request's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from app.engine.decoding import PromptPrefill
from app.engine.sequence import GenerationRequest, SequenceState
from app.engine.teacher_forcing import ScoringPass
from app.serving.events import Event, Timing
from app.uncertainty.answer import AnswerScorer
from app.uncertainty.tad import TadStream


class SequenceObserver(Protocol):
    """What a generation request wants done with its sequence between steps (on the worker thread).

    An observer may also say, with a `needs_steps` attribute fixed for its life, that `on_step` has
    nothing to do before the sequence finishes (a whole answer without early stop): the scheduler then
    calls it only when the sequence finishes, so that answer costs the steps nothing. Without the
    attribute, `on_step` runs every step."""

    def on_step(self, sequence: SequenceState) -> list[Event]:
        """Events to send now; may finish the sequence (an early stop)."""
        ...

    def tad_pending(self, sequence: SequenceState) -> tuple[TadStream, int, list[np.ndarray]] | None:
        """The TAD stream `on_step` will advance, with its number of log-probs and its step rows (None: no
        stream), so that the scheduler can prime it with the step's others."""
        ...

    def on_finish(self, sequence: SequenceState, timing: Timing) -> list[Event]:
        """The last events of a sequence that ended normally (its result comes last)."""
        ...


@dataclass(eq=False)
class WorkItem:
    """One request's place in the scheduler; all fields but `cancelled` belong to the worker."""

    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event]
    deadline: float
    enqueued_at: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    released: bool = False


@dataclass(eq=False)
class GenerationItem(WorkItem):
    request: GenerationRequest | None = None
    observer: SequenceObserver | None = None
    sequence: SequenceState | None = None
    admitted_at: float | None = None
    first_token_at: float | None = None
    stepped: bool = False  # its observer's `on_step` runs every step (set when it joins the batch)

    def timing(self, now: float) -> Timing:
        """Its phases, from its arrival, for an answer finished at `now`."""
        return Timing(
            queued_s=(self.admitted_at or now) - self.enqueued_at,
            first_token_s=(self.first_token_at - self.enqueued_at) if self.first_token_at else None,
            total_s=now - self.enqueued_at,
        )


@dataclass(eq=False)
class ScoringItem(WorkItem):
    prompt_ids: tuple[int, ...] = ()
    answer_ids: tuple[int, ...] = ()
    scorer: AnswerScorer | None = None  # the scorer the request started with (None: the scheduler's)


@dataclass(eq=False)
class PendingWork:
    """Queued or under way: a prefill (a group of whole prompts, or prompts chunked by columns) or a
    teacher-forced scoring pass, and the items it answers."""

    job: PromptPrefill | ScoringPass
    items: list[GenerationItem] | list[ScoringItem]


@dataclass
class SchedulerStats:
    """What the metrics read (written by the worker, read by the event loop)."""

    queue_depth: int = 0
    running: int = 0  # admitted: decoding or being prefilled
    average_request_s: float = 1.0


def _deliver(events: Sequence[tuple[WorkItem, Event]]) -> None:
    for item, event in events:
        item.events.put_nowait(event)


class Outbox:
    """Events the worker produced, handed to their event loops together once per forward.

    Each `call_soon_threadsafe` wakes the event loop (a write to its self-pipe), and the woken loop
    then competes with the worker for the GIL: with one wake-up per event, a step that streams a token
    to every row (or ends many answers) paid it once per row. Events keep their order per request.
    """

    def __init__(self) -> None:
        self._events: dict[asyncio.AbstractEventLoop, list[tuple[WorkItem, Event]]] = {}

    def put(self, item: WorkItem, event: Event) -> None:
        self._events.setdefault(item.loop, []).append((item, event))

    def flush(self) -> None:
        if not self._events:
            return
        pending, self._events = self._events, {}
        for loop, events in pending.items():
            # A closed loop has nobody waiting for these events any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_deliver, events)


def _prompt_length(item: GenerationItem) -> int:
    return len(item.request.prompt_ids) if item.request is not None else 0


def prefill_groups(items: list[GenerationItem], budget: int) -> tuple[list[GenerationItem], list[list[GenerationItem]]]:
    """The prompts to prefill at once and the groups to queue: shortest first, in groups whose padded
    size (count x longest) fits in `budget` tokens, the first run at once unless even the shortest
    prompt is longer than `budget` (a prompt that long is a group of its own, chunked by columns).

    Whole prompts in separate passes rather than one pass chunked by columns: a group's rows start
    decoding as soon as it is prefilled instead of all waiting for the last chunk, and a pass over
    whole prompts costs less than a chunk of the same size over all of them, which attends to the
    columns before it and appends to every layer's cache. Unless the queued groups would take more
    passes than chunking their prompts together (prompts just over half the budget, a group each):
    those are then queued as one prefill, chunked by columns."""
    groups: list[list[GenerationItem]] = []
    for item in sorted(items, key=_prompt_length):
        if groups and (len(groups[-1]) + 1) * _prompt_length(item) <= budget:
            groups[-1].append(item)
        else:
            groups.append([item])
    at_once: list[GenerationItem] = []
    if groups and _prompt_length(groups[0][0]) <= budget:
        at_once = groups.pop(0)
    fitting = [group for group in groups if _prompt_length(group[-1]) <= budget]
    rows = [item for group in fitting for item in group]
    if rows:
        columns_per_chunk = max(1, budget // len(rows))  # as `ChunkedColumns.chunk_end` cuts them
        if len(fitting) > math.ceil(_prompt_length(rows[-1]) / columns_per_chunk):
            groups = [rows, *groups[len(fitting) :]]
    return at_once, groups
