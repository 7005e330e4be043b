"""Shared by the scheduler's unit tests: a generation request as the service hands it over, an
observer that only records, and a scheduler run around an async body."""

from __future__ import annotations

import asyncio
import time

from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest, SequenceState
from app.serving.events import Event, Timing
from app.serving.scheduler import Scheduler
from app.serving.work_items import GenerationItem, ScoringItem


class RecordingObserver:
    """Counts steps and answers with the sequence itself."""

    def __init__(self) -> None:
        self.steps = 0

    def on_step(self, sequence: SequenceState) -> list[Event]:
        self.steps += 1
        return []

    def tad_pending(self, sequence: SequenceState) -> None:
        return None

    def on_finish(self, sequence: SequenceState, timing: Timing) -> list[Event]:
        return [("done", sequence, timing)]  # type: ignore[list-item]


def generation_item(loop: asyncio.AbstractEventLoop, prompt: tuple[int, ...], tokens: int, deadline_s: float = 60.0):
    return GenerationItem(
        loop=loop,
        events=asyncio.Queue(),
        deadline=time.monotonic() + deadline_s,
        request=GenerationRequest(prompt_ids=prompt, params=SamplingParams(max_new_tokens=tokens)),
        observer=RecordingObserver(),
    )


def run_on(scheduler: Scheduler, body) -> object:
    scheduler.start()
    try:
        return asyncio.run(body())
    finally:
        scheduler.stop()


def scoring_item(loop: asyncio.AbstractEventLoop, prompt: tuple[int, ...], response: tuple[int, ...]) -> ScoringItem:
    return ScoringItem(
        loop=loop, events=asyncio.Queue(), deadline=time.monotonic() + 60, prompt_ids=prompt, answer_ids=response
    )


def wait_until_idle(scheduler: Scheduler) -> None:
    deadline = time.monotonic() + 10
    while scheduler.unanswered and time.monotonic() < deadline:
        time.sleep(0.01)
    assert scheduler.unanswered == 0
