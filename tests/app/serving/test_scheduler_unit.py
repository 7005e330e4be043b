"""The scheduler on its own (no HTTP): batching, admission limits, failures, deadlines."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref

import pytest

from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest, SequenceState
from app.errors import DeadlineExceeded, NotReady, Overloaded
from app.serving.events import Event, Failure
from app.serving.scheduler import Scheduler
from app.serving.work_items import ScoringItem
from app.uncertainty.answer import AnswerScorer
from tests.app.serving.scheduler_items import RecordingObserver, generation_item, run_on, scoring_item, wait_until_idle


def test_requests_are_batched_and_each_gets_its_own_answer(engine: Engine) -> None:
    batches: list[int] = []
    scheduler = Scheduler(
        engine, AnswerScorer(None), max_batch_size=4, max_queue=4, batch_window_s=0.2, on_batch=batches.append
    )
    prompts = [(5, 6, 7), (8,), (9, 10), (11, 12, 13, 14)]

    async def body() -> list[object]:
        loop = asyncio.get_running_loop()
        items = [generation_item(loop, prompt, tokens=6) for prompt in prompts]
        for item in items:
            scheduler.submit_generation(item)
        return [await asyncio.wait_for(item.events.get(), 30) for item in items]

    answers = run_on(scheduler, body)
    alone = engine.generate([GenerationRequest(p, SamplingParams(max_new_tokens=6)) for p in prompts])
    for (tag, sequence, timing), expected in zip(answers, alone, strict=True):  # type: ignore[misc]
        assert tag == "done" and timing.total_s >= timing.queued_s >= 0
        assert [t.token_id for t in sequence.kept_tokens] == [t.token_id for t in expected.kept_tokens]
    assert max(batches) == len(prompts)
    # Each step is recorded once with the rows it computed: the prefill that made the first tokens, five
    # decode steps, and the one that captures the last token's attention row (the engine's last_row).
    assert batches == [len(prompts)] * (6 + 1)
    assert scheduler.unanswered == 0


def test_a_request_joining_a_running_batch_is_recorded_once_per_forward(engine: Engine) -> None:
    batches: list[int] = []
    scheduler = Scheduler(
        engine, AnswerScorer(None), max_batch_size=4, max_queue=4, batch_window_s=0.0, on_batch=batches.append
    )

    async def body() -> None:
        loop = asyncio.get_running_loop()
        first, second = generation_item(loop, (5, 6, 7), tokens=40), generation_item(loop, (8, 9), tokens=3)
        scheduler.submit_generation(first)
        while first.observer.steps < 3:  # running: the second joins a batch that has decoded a few steps
            await asyncio.sleep(0.001)
        scheduler.submit_generation(second)
        for item in (first, second):
            await asyncio.wait_for(item.events.get(), 30)

    run_on(scheduler, body)
    # Every row computed once: each answer's prefill and decode steps (its tokens) and the last-row step.
    rows = 40 + 1 + 3 + 1
    assert sum(batches) == rows and max(batches) == 2


class FailingObserver(RecordingObserver):
    """Breaks on the third step, as a scorer or detokeniser bug on one answer would."""

    def on_step(self, sequence: SequenceState) -> list[Event]:
        events = super().on_step(sequence)
        if self.steps == 3:
            raise RuntimeError("this answer's scoring broke")
        return events


def test_one_answer_failing_mid_generation_fails_alone(engine: Engine) -> None:
    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=4, max_queue=4, batch_window_s=0.2)

    async def body() -> tuple[object, object]:
        loop = asyncio.get_running_loop()
        broken, fine = generation_item(loop, (5, 6, 7), tokens=8), generation_item(loop, (8, 9), tokens=8)
        broken.observer = FailingObserver()
        scheduler.submit_generation(broken)
        scheduler.submit_generation(fine)
        return tuple([await asyncio.wait_for(item.events.get(), 30) for item in (broken, fine)])

    failed, answered = run_on(scheduler, body)  # type: ignore[misc]
    assert isinstance(failed, Failure) and "scoring the answer failed" in failed.error.message
    expected = engine.generate([GenerationRequest((8, 9), SamplingParams(max_new_tokens=8))])[0]
    assert answered[0] == "done" and [t.token_id for t in answered[1].kept_tokens] == [
        t.token_id for t in expected.kept_tokens
    ]
    assert scheduler.unanswered == 0


def test_admission_beyond_batch_and_queue_is_refused(engine: Engine) -> None:
    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=1, max_queue=1, batch_window_s=0.0)

    async def body() -> None:
        loop = asyncio.get_running_loop()
        first, second, third = (generation_item(loop, (5,), tokens=200) for _ in range(3))
        scheduler.submit_generation(first)
        scheduler.submit_generation(second)
        with pytest.raises(Overloaded):
            scheduler.submit_generation(third)
        # A request's own follow-up pass (a check pass) is part of work already admitted.
        check = scoring_item(loop, (5, 6), (7,))
        scheduler.submit_scoring(check, follow_up=True)
        for item in (first, second, check):
            scheduler.cancel(item)

    run_on(scheduler, body)
    wait_until_idle(scheduler)


def test_a_request_past_its_deadline_fails_with_deadline_exceeded(engine: Engine) -> None:
    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=2, max_queue=2, batch_window_s=0.0)

    async def body() -> object:
        item = generation_item(asyncio.get_running_loop(), (5, 6), tokens=10_000, deadline_s=0.2)
        scheduler.submit_generation(item)
        return await asyncio.wait_for(item.events.get(), 30)

    event = run_on(scheduler, body)
    assert isinstance(event, Failure) and isinstance(event.error, DeadlineExceeded)


def test_a_stopped_scheduler_refuses_work_as_not_ready_not_as_overloaded(engine: Engine) -> None:
    """A 429 invites a retry on the same replica; one that is shutting down is not ready (503), a check pass
    of an answer already generated included."""
    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=2, max_queue=2, batch_window_s=0.0)
    scheduler.start()
    scheduler.stop()

    async def body() -> None:
        loop = asyncio.get_running_loop()
        with pytest.raises(NotReady):
            scheduler.submit_generation(generation_item(loop, (5, 6), tokens=2))
        with pytest.raises(NotReady):
            scheduler.submit_scoring(scoring_item(loop, (5, 6), (7,)), follow_up=True)

    asyncio.run(body())


def test_the_pass_in_progress_is_timed_and_cleared_when_it_returns(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine.decoding import DecodeBatch

    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=2, max_queue=2, batch_window_s=0.0)
    entered, release = threading.Event(), threading.Event()
    original = DecodeBatch.step

    def hanging_step(self: DecodeBatch) -> None:
        entered.set()
        release.wait(30)
        original(self)

    monkeypatch.setattr(DecodeBatch, "step", hanging_step)

    async def body() -> object:
        item = generation_item(asyncio.get_running_loop(), (5, 6), tokens=3)
        assert scheduler.pass_running_s == 0.0
        scheduler.submit_generation(item)
        await asyncio.to_thread(entered.wait, 30)
        await asyncio.sleep(0.05)
        assert scheduler.pass_running_s >= 0.05  # the worker is inside a step that has not returned
        monkeypatch.setattr(DecodeBatch, "step", original)
        release.set()
        return await asyncio.wait_for(item.events.get(), 30)

    assert run_on(scheduler, body)[0] == "done"  # type: ignore[index]
    assert scheduler.pass_running_s == 0.0


def test_starting_a_worker_that_still_runs_is_refused(engine: Engine) -> None:
    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=2, max_queue=2, batch_window_s=0.0)
    scheduler.start()
    try:
        with pytest.raises(RuntimeError, match="still running"):
            scheduler.start()
    finally:
        scheduler.stop()
    scheduler.start()  # after a stop that ended it, a new worker starts
    scheduler.stop()


def test_an_idle_worker_holds_no_answered_request(engine: Engine) -> None:
    """Between requests the worker keeps nothing of the last pass: an answered item (its sequence, its attention
    rows, the scorer of an artifact a reload may have replaced since) is garbage once its client lets go."""
    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=2, max_queue=2, batch_window_s=0.0)

    async def body() -> weakref.ref[ScoringItem]:
        item = scoring_item(asyncio.get_running_loop(), (5, 6, 7), (8, 9))
        scheduler.submit_scoring(item)
        await asyncio.wait_for(item.events.get(), 30)
        wait_until_idle(scheduler)
        return weakref.ref(item)

    scheduler.start()
    try:
        answered = asyncio.run(body())
        deadline = time.monotonic() + 5  # the worker goes round its loop to sit idle; then nothing holds the item
        while answered() is not None and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.05)
        assert answered() is None
    finally:
        scheduler.stop()
