"""What the scheduler does per step, and what it no longer does: observers with nothing to do between steps,
events handed to the event loop once per forward, cancellations and deadlines looked for when due."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from app.engine.decoding import PromptPrefill
from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest, SequenceState
from app.serving.events import Event, Timing
from app.serving.scheduler import Scheduler
from app.serving.work_items import GenerationItem, Outbox
from app.uncertainty.answer import AnswerScorer


class Observer:
    """Counts its calls; with `needs_steps`, emits one event per step, else has nothing to do between steps."""

    def __init__(self, needs_steps: bool) -> None:
        self.needs_steps = needs_steps
        self.steps = 0

    def on_step(self, sequence: SequenceState) -> list[Event]:
        self.steps += 1
        return [("step", len(sequence.tokens))] if self.needs_steps else []  # type: ignore[list-item]

    def tad_pending(self, sequence: SequenceState) -> None:
        return None

    def on_finish(self, sequence: SequenceState, timing: Timing) -> list[Event]:
        return [("done", sequence, timing)]  # type: ignore[list-item]


def _item(loop: asyncio.AbstractEventLoop, prompt: tuple[int, ...], tokens: int, observer: Any) -> GenerationItem:
    return GenerationItem(
        loop=loop,
        events=asyncio.Queue(),
        deadline=time.monotonic() + 60,
        request=GenerationRequest(prompt_ids=prompt, params=SamplingParams(max_new_tokens=tokens)),
        observer=observer,
    )


def _run(scheduler: Scheduler, body: Any) -> Any:
    scheduler.start()
    try:
        return asyncio.run(body())
    finally:
        scheduler.stop()


async def _events_until_done(item: GenerationItem) -> list[Any]:
    events = []
    while True:
        event = await asyncio.wait_for(item.events.get(), 30)
        events.append(event)
        if event[0] == "done":  # type: ignore[index]
            return events


def test_an_observer_with_nothing_to_do_between_steps_is_not_called_until_its_answer_ends(engine: Engine) -> None:
    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=2, max_queue=2, batch_window_s=0.2)
    idle, busy = Observer(needs_steps=False), Observer(needs_steps=True)

    async def body() -> list[list[Any]]:
        loop = asyncio.get_running_loop()
        items = [_item(loop, (5, 6, 7), 6, idle), _item(loop, (8, 9), 6, busy)]
        for item in items:
            scheduler.submit_generation(item)
        return [await _events_until_done(item) for item in items]

    quiet, stepped = _run(scheduler, body)
    assert idle.steps == 0  # its answer ends through on_finish alone
    assert [tag for tag, *_ in quiet] == ["done"]
    assert busy.steps > 1 and [tag for tag, *_ in stepped].count("step") == busy.steps
    for (_, sequence, _), prompt in zip((quiet[-1], stepped[-1]), ((5, 6, 7), (8, 9)), strict=True):
        alone = engine.generate([GenerationRequest(prompt, SamplingParams(max_new_tokens=6))])[0]
        assert [t.token_id for t in sequence.kept_tokens] == [t.token_id for t in alone.kept_tokens]


def test_a_forwards_events_reach_the_event_loop_in_one_wake_up(engine: Engine) -> None:
    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=4, max_queue=4, batch_window_s=0.2)
    forwards: list[int] = []
    scheduler.on_batch = forwards.append
    wake_ups = 0

    async def body() -> list[list[Any]]:
        nonlocal wake_ups
        loop = asyncio.get_running_loop()
        call_soon_threadsafe = loop.call_soon_threadsafe

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal wake_ups
            wake_ups += 1
            return call_soon_threadsafe(*args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        items = [_item(loop, (5 + i, 6, 7), 5, Observer(needs_steps=True)) for i in range(4)]
        for item in items:
            scheduler.submit_generation(item)
        return [await _events_until_done(item) for item in items]

    answers = _run(scheduler, body)
    events = sum(len(events) for events in answers)
    assert events > len(forwards) * 2  # every row gets an event at every forward ...
    assert wake_ups <= len(forwards) + 1  # ... and the loop is woken once per forward, not once per event
    for events in answers:  # in order per request
        steps = [count for tag, count, *_ in events if tag == "step"]
        assert steps == sorted(steps)


def test_a_running_request_cancelled_leaves_the_batch_and_its_neighbour_is_answered_as_alone(engine: Engine) -> None:
    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=2, max_queue=2, batch_window_s=0.2)

    async def body() -> list[Any]:
        loop = asyncio.get_running_loop()
        long = _item(loop, (5, 6, 7), 10_000, Observer(needs_steps=False))
        short = _item(loop, (8, 9), 12, Observer(needs_steps=False))
        scheduler.submit_generation(long)
        scheduler.submit_generation(short)
        while long.sequence is None or len(long.sequence.tokens) < 3:
            await asyncio.sleep(0.005)
        scheduler.cancel(long)
        answer = await _events_until_done(short)
        deadline = time.monotonic() + 10
        while scheduler.unanswered and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert long.sequence.abandoned and len(long.sequence.tokens) < 10_000
        return answer

    (_, sequence, _), *_ = _run(scheduler, body)
    assert scheduler.unanswered == 0
    alone = engine.generate([GenerationRequest((8, 9), SamplingParams(max_new_tokens=12))])[0]
    assert [t.token_id for t in sequence.kept_tokens] == [t.token_id for t in alone.kept_tokens]


def test_the_outbox_keeps_each_requests_order_and_skips_a_closed_loop() -> None:
    async def body() -> list[Any]:
        loop = asyncio.get_running_loop()
        closed = asyncio.new_event_loop()
        closed.close()
        outbox = Outbox()
        items = [_item(loop, (1,), 1, None) for _ in range(2)]
        gone = _item(closed, (1,), 1, None)
        for event in range(3):
            for item in (*items, gone):
                outbox.put(item, event)  # type: ignore[arg-type]
        outbox.flush()  # the closed loop's events are dropped, the others delivered
        outbox.flush()  # nothing left: no wake-up
        await asyncio.sleep(0)
        return [[item.events.get_nowait() for _ in range(item.events.qsize())] for item in items]

    assert asyncio.run(body()) == [[0, 1, 2], [0, 1, 2]]


class PrefillRecorder:
    """Wraps `engine.start_prefill`: every prefill pass, in the order they run, as its prompts and the running
    answer's token count then, and `watch()` then; `on_first_pass` runs before the first pass."""

    def __init__(self, engine: Engine, running: GenerationItem) -> None:
        self.start_prefill = engine.start_prefill
        self.running = running
        self.passes: list[tuple[list[tuple[int, ...]], int]] = []
        self.on_first_pass: Any = None
        self.watch: Any = lambda: None
        self.watched: list[Any] = []

    def __call__(self, requests: list[GenerationRequest]) -> PromptPrefill:
        job = self.start_prefill(requests)
        prompts = [request.prompt_ids for request in requests]
        advance = job.advance

        def recorded(max_tokens: int | None = None) -> object:
            if self.on_first_pass is not None:
                self.on_first_pass, hook = None, self.on_first_pass
                hook()
            sequence = self.running.sequence
            self.passes.append((prompts, len(sequence.tokens) if sequence is not None else 0))
            self.watched.append(self.watch())
            return advance(max_tokens)

        job.advance = recorded  # type: ignore[method-assign]
        return job


def _submit_together(scheduler: Scheduler, items: list[GenerationItem]) -> None:
    """Queued under the scheduler's lock, so that the worker admits them all at its next pass."""
    with scheduler._condition:
        for item in items:
            scheduler.submit_generation(item)


def _prefilling_scheduler(engine: Engine, max_batch_size: int, prefill_chunk_tokens: int) -> Scheduler:
    return Scheduler(
        engine,
        AnswerScorer(None),
        max_batch_size=max_batch_size,
        max_queue=max_batch_size,
        batch_window_s=0.0,
        prefill_chunk_tokens=prefill_chunk_tokens,
    )


async def _decoding_answer(
    scheduler: Scheduler, engine: Engine, monkeypatch: pytest.MonkeyPatch, tokens: int
) -> tuple[GenerationItem, PrefillRecorder]:
    """An answer of `tokens` tokens, decoding, with the engine's prefills recorded from its own on."""
    running = _item(asyncio.get_running_loop(), (5, 6), tokens, Observer(needs_steps=False))
    recorder = PrefillRecorder(engine, running)
    monkeypatch.setattr(engine, "start_prefill", recorder)
    scheduler.submit_generation(running)
    while running.sequence is None or len(running.sequence.tokens) < 2:
        await asyncio.sleep(0.002)
    return running, recorder


async def _until_idle(scheduler: Scheduler) -> None:
    deadline = time.monotonic() + 20
    while scheduler.unanswered and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def test_short_prompts_beyond_one_chunk_are_prefilled_whole_a_group_a_step_and_decode_as_soon_as_prefilled(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = _prefilling_scheduler(engine, max_batch_size=8, prefill_chunk_tokens=8)
    prompts = [(5 + i, 6 + i, 7 + i, 8 + i) for i in range(6)]  # two fit in a chunk: three groups

    async def body() -> list[Any]:
        loop = asyncio.get_running_loop()
        running, recorder = await _decoding_answer(scheduler, engine, monkeypatch, tokens=60)
        items = [_item(loop, prompt, 8, Observer(needs_steps=False)) for prompt in prompts]
        recorder.watch = lambda: [len(item.sequence.tokens) if item.sequence else 0 for item in items[:2]]
        _submit_together(scheduler, items)
        answers = [await _events_until_done(item) for item in (running, *items)]
        groups = [prompts_of_pass for prompts_of_pass, _ in recorder.passes[1:]]
        assert groups == [prompts[0:2], prompts[2:4], prompts[4:6]]  # whole prompts: one pass a group
        running_tokens = [tokens for _, tokens in recorder.passes[1:]]
        # The first group runs at once with the queued one after it, then one group a step.
        assert running_tokens[1] == running_tokens[0] and running_tokens[2] == running_tokens[1] + 1
        # By the last group's pass the first group has decoded a step past the token its prefill chose.
        assert recorder.watched[-1] == [2, 2]
        return answers

    answers = _run(scheduler, body)
    for events, prompt in zip(answers[1:], prompts, strict=True):
        alone = engine.generate([GenerationRequest(prompt, SamplingParams(max_new_tokens=8))])[0]
        sequence = events[-1][1]
        assert [t.token_id for t in sequence.kept_tokens] == [t.token_id for t in alone.kept_tokens]
    assert scheduler.unanswered == 0


def test_a_request_cancelled_while_its_prefill_group_waits_its_turn_is_abandoned_as_it_joins(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its cancellation is seen by a step of the running batch while its group still waits to be prefilled; the
    step after the group joins must still look for it, or it would decode for nobody until its deadline."""
    scheduler = _prefilling_scheduler(engine, max_batch_size=8, prefill_chunk_tokens=6)

    async def body() -> list[Any]:
        loop = asyncio.get_running_loop()
        running, recorder = await _decoding_answer(scheduler, engine, monkeypatch, tokens=60)
        # Two fit in a chunk: groups (first, second) at once, (third, fourth) after them in the same pass,
        # (kept, dropped) at the next; `dropped` is cancelled as the first group runs.
        fillers = [_item(loop, (7 + i, 8 + i, 9 + i), 4, Observer(needs_steps=False)) for i in range(4)]
        kept = _item(loop, (20, 21, 22), 4, Observer(needs_steps=False))
        dropped = _item(loop, (23, 24, 25), 10_000, Observer(needs_steps=False))
        recorder.on_first_pass = lambda: scheduler.cancel(dropped)
        _submit_together(scheduler, [*fillers, kept, dropped])
        answers = [await _events_until_done(item) for item in (running, *fillers, kept)]
        await _until_idle(scheduler)
        assert recorder.passes[-1][0] == [(20, 21, 22), (23, 24, 25)]
        assert dropped.sequence is not None and dropped.sequence.abandoned
        assert len(dropped.sequence.tokens) < 100
        return answers

    _run(scheduler, body)
    assert scheduler.unanswered == 0


def test_a_request_cancelled_during_a_shared_chunked_prefill_is_abandoned_as_it_joins(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prompts just over half the budget are chunked together by columns (`prefill_groups`). One cancelled as
    the first pass runs is seen by a step of the running batch while the chunks go on; the step after they
    join must still look for it, or it would decode for nobody until its deadline."""
    scheduler = _prefilling_scheduler(engine, max_batch_size=10, prefill_chunk_tokens=9)

    async def body() -> list[Any]:
        loop = asyncio.get_running_loop()
        running, recorder = await _decoding_answer(scheduler, engine, monkeypatch, tokens=60)
        kept = [_item(loop, (7 + i, 8, 9, 10, 11), 4, Observer(needs_steps=False)) for i in range(7)]
        dropped = _item(loop, (30, 31, 32, 33, 34), 10_000, Observer(needs_steps=False))
        recorder.on_first_pass = lambda: scheduler.cancel(dropped)
        _submit_together(scheduler, [*kept, dropped])
        answers = [await _events_until_done(item) for item in (running, *kept)]
        await _until_idle(scheduler)
        chunked = [prompts for prompts, _ in recorder.passes if (30, 31, 32, 33, 34) in prompts]
        assert len(chunked) == 5 and len(chunked[0]) == 7  # seven rows, a column a pass
        assert dropped.sequence is not None and dropped.sequence.abandoned
        assert len(dropped.sequence.tokens) < 100
        return answers

    _run(scheduler, body)
    assert scheduler.unanswered == 0


def test_queued_prefill_groups_hold_their_slots_until_they_join(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every queued group's rows count against the batch size, not only the group whose turn it is."""
    scheduler = _prefilling_scheduler(engine, max_batch_size=6, prefill_chunk_tokens=4)
    prompts = [(5 + i, 6, 7, 8) for i in range(8)]  # one a group
    rows_at_each_pass: list[int] = []

    async def body() -> list[Any]:
        loop = asyncio.get_running_loop()
        running, recorder = await _decoding_answer(scheduler, engine, monkeypatch, tokens=40)
        items = [_item(loop, prompt, 6, Observer(needs_steps=False)) for prompt in prompts]

        def rows_held() -> int:
            decoding = len(scheduler._batch.sequences) if scheduler._batch is not None else 0
            return decoding + sum(len(pending.items) for pending in scheduler._pending)

        recorder.watch = lambda: rows_at_each_pass.append(rows_held())
        _submit_together(scheduler, items)
        return [await _events_until_done(item) for item in (running, *items)]

    answers = _run(scheduler, body)
    assert len(answers) == 9 and all(events[-1][0] == "done" for events in answers)
    assert len(rows_at_each_pass) >= len(prompts) and max(rows_at_each_pass) <= 6, rows_at_each_pass


@pytest.mark.parametrize("lookahead", [False, True], ids=["in-step", "lookahead"])
def test_with_a_slot_batch_the_scheduler_decodes_in_its_slots_and_answers_equal_alone(
    engine: Engine, monkeypatch: Any, lookahead: bool
) -> None:
    """What the scheduler does with the CUDA graph's slot batch (`Engine.running_batch`), its step run eagerly here:
    rows join its free slots and leave them, and every answer equals its request generated alone."""
    from app.engine.slot_decoding import SlotDecodeBatch

    slot_batch = SlotDecodeBatch(engine.context, slots=2, max_length=128, compiled=False, lookahead=lookahead)
    handed_out: list[SlotDecodeBatch] = []

    def running_batch(slots: int) -> SlotDecodeBatch:
        assert slots == 2
        slot_batch.clear()
        handed_out.append(slot_batch)
        return slot_batch

    monkeypatch.setattr(engine, "running_batch", running_batch)
    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=2, max_queue=8, batch_window_s=0.0)
    prompts = [(5, 6, 7), (8, 9), (10, 11, 12, 13), (14,), (15, 16)]
    lengths = [6, 3, 8, 2, 5]

    async def body() -> list[list[Any]]:
        loop = asyncio.get_running_loop()
        items = [_item(loop, p, n, Observer(needs_steps=True)) for p, n in zip(prompts, lengths, strict=True)]
        for item in items:
            scheduler.submit_generation(item)
        return [await _events_until_done(item) for item in items]

    answers = _run(scheduler, body)
    assert handed_out and all(batch is slot_batch for batch in handed_out)
    for events, prompt, length in zip(answers, prompts, lengths, strict=True):
        sequence = events[-1][1]
        alone = engine.generate([GenerationRequest(prompt, SamplingParams(max_new_tokens=length))])[0]
        assert [t.token_id for t in sequence.kept_tokens] == [t.token_id for t in alone.kept_tokens]
        assert len(sequence.attention_rows) == len(alone.attention_rows)
