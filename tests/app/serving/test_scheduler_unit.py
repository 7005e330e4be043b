"""The scheduler on its own (no HTTP): batching, admission limits, cancellation, deadlines."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest, SequenceState
from app.errors import DeadlineExceeded, Overloaded
from app.serving.events import Event, Failure, Timing
from app.serving.scheduler import GenerationItem, Scheduler
from app.uncertainty.answer import AnswerScorer


class RecordingObserver:
    """Counts steps and answers with the sequence itself."""

    def __init__(self) -> None:
        self.steps = 0

    def on_step(self, sequence: SequenceState) -> list[Event]:
        self.steps += 1
        return []

    def on_finish(self, sequence: SequenceState, timing: Timing) -> list[Event]:
        return [("done", sequence, timing)]  # type: ignore[list-item]


def _item(loop: asyncio.AbstractEventLoop, prompt: tuple[int, ...], tokens: int, deadline_s: float = 60.0):
    return GenerationItem(
        loop=loop,
        events=asyncio.Queue(),
        deadline=time.monotonic() + deadline_s,
        request=GenerationRequest(prompt_ids=prompt, params=SamplingParams(max_new_tokens=tokens)),
        observer=RecordingObserver(),
    )


def _run(scheduler: Scheduler, body) -> object:
    scheduler.start()
    try:
        return asyncio.run(body())
    finally:
        scheduler.stop()


def test_requests_are_batched_and_each_gets_its_own_answer(engine: Engine) -> None:
    batches: list[int] = []
    scheduler = Scheduler(
        engine, AnswerScorer(None), max_batch_size=4, max_queue=4, batch_window_s=0.2, on_batch=batches.append
    )
    prompts = [(5, 6, 7), (8,), (9, 10), (11, 12, 13, 14)]

    async def body() -> list[object]:
        loop = asyncio.get_running_loop()
        items = [_item(loop, prompt, tokens=6) for prompt in prompts]
        for item in items:
            scheduler.submit_generation(item)
        return [await asyncio.wait_for(item.events.get(), 30) for item in items]

    answers = _run(scheduler, body)
    alone = engine.generate([GenerationRequest(p, SamplingParams(max_new_tokens=6)) for p in prompts])
    for (tag, sequence, timing), expected in zip(answers, alone, strict=True):  # type: ignore[misc]
        assert tag == "done" and timing.total_s >= timing.queued_s >= 0
        assert [t.token_id for t in sequence.kept_tokens] == [t.token_id for t in expected.kept_tokens]
    assert max(batches) == len(prompts)
    assert scheduler.in_flight == 0


def test_admission_beyond_batch_and_queue_is_refused(engine: Engine) -> None:
    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=1, max_queue=1, batch_window_s=0.0)

    async def body() -> None:
        loop = asyncio.get_running_loop()
        first, second, third = (_item(loop, (5,), tokens=200) for _ in range(3))
        scheduler.submit_generation(first)
        scheduler.submit_generation(second)
        with pytest.raises(Overloaded):
            scheduler.submit_generation(third)
        scheduler.cancel(first)
        scheduler.cancel(second)

    _run(scheduler, body)
    deadline = time.monotonic() + 10
    while scheduler.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert scheduler.in_flight == 0


def test_a_request_past_its_deadline_fails_with_deadline_exceeded(engine: Engine) -> None:
    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=2, max_queue=2, batch_window_s=0.0)

    async def body() -> object:
        item = _item(asyncio.get_running_loop(), (5, 6), tokens=10_000, deadline_s=0.2)
        scheduler.submit_generation(item)
        return await asyncio.wait_for(item.events.get(), 30)

    event = _run(scheduler, body)
    assert isinstance(event, Failure) and isinstance(event.error, DeadlineExceeded)
