"""Admission into the scheduler's queues: refused once shutdown abandons the work, until the worker starts again."""

from __future__ import annotations

import asyncio

import pytest

from app.engine.engine import Engine
from app.errors import NotReady
from app.serving.scheduler import Scheduler
from app.uncertainty.answer import AnswerScorer
from tests.app.serving.scheduler_items import generation_item, scoring_item


def test_work_arriving_after_everything_was_abandoned_is_refused_not_run(engine: Engine) -> None:
    """A handler past its readiness check when the drain gave up (still tokenizing, or a check pass of an answer
    just abandoned) gets the 503, not a generation uvicorn would cut off mid-way."""
    scheduler = Scheduler(engine, AnswerScorer(None), max_batch_size=2, max_queue=2, batch_window_s=0.0)

    async def body() -> None:
        loop = asyncio.get_running_loop()
        scheduler.abandon_everything(NotReady("the service is shutting down"))
        with pytest.raises(NotReady):
            scheduler.submit_generation(generation_item(loop, (5, 6), tokens=2))
        with pytest.raises(NotReady):
            scheduler.submit_scoring(scoring_item(loop, (5, 6), (7,)), follow_up=True)
        assert scheduler.unanswered == 0
        scheduler.start()  # a restarted worker admits again
        try:
            item = generation_item(loop, (5, 6), tokens=2)
            scheduler.submit_generation(item)
            assert (await asyncio.wait_for(item.events.get(), 30))[0] == "done"  # type: ignore[index]
        finally:
            scheduler.stop()

    asyncio.run(body())
