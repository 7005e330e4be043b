"""GenerationService.next_event: what a request waiting for its next event gives up on, and when."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from app.errors import DeadlineExceeded
from app.serving.events import KeepAlive
from app.serving.service import DEADLINE_GRACE_S, GenerationService
from app.serving.work_items import WorkItem


def _service_cancelling_into(cancelled: list[WorkItem]) -> GenerationService:
    service = GenerationService.__new__(GenerationService)  # next_event needs only the scheduler
    service.scheduler = SimpleNamespace(cancel=cancelled.append)  # type: ignore[assignment]
    return service


async def _wait(deadline: float, keep_alive_at: float, cancelled: list[WorkItem]) -> object:
    item = WorkItem(loop=asyncio.get_running_loop(), events=asyncio.Queue(), deadline=deadline)
    return await _service_cancelling_into(cancelled).next_event(item, None, keep_alive_at)


def test_a_keep_alive_due_at_every_poll_does_not_hide_a_deadline_long_past() -> None:
    # A keep-alive interval shorter than the poll would otherwise answer every wait with a KeepAlive.
    cancelled: list[WorkItem] = []
    with pytest.raises(DeadlineExceeded):
        asyncio.run(_wait(time.monotonic() - DEADLINE_GRACE_S - 1, 0.0, cancelled))
    assert len(cancelled) == 1  # and the worker is told to drop it


def test_a_keep_alive_when_nothing_came_and_the_deadline_is_ahead() -> None:
    cancelled: list[WorkItem] = []
    assert isinstance(asyncio.run(_wait(time.monotonic() + 60, 0.0, cancelled)), KeepAlive) and cancelled == []


def _service_on(context: int, refusal: str | None, slot_length: int) -> GenerationService:
    service = GenerationService.__new__(GenerationService)  # the context checks need only the engine
    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=context))
    service.engine = SimpleNamespace(  # type: ignore[assignment]
        loaded=SimpleNamespace(model=model),
        compiled_decode_refusal=lambda: refusal,
        compiled_decode_length=slot_length,
    )
    return service


def test_a_check_pass_whose_client_has_gone_is_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer is finished when its check pass runs: the pass is the only work left to drop."""
    from app.serving import service as service_module

    monkeypatch.setattr(service_module, "check_pass", lambda engine, question, answer: ((1, 2, 3), (4,)))
    service = _service_on(context=2048, refusal="compiled decoding is off", slot_length=64)
    submitted: list[WorkItem] = []
    cancelled: list[WorkItem] = []
    service.scheduler = SimpleNamespace(  # type: ignore[assignment]
        submit_scoring=lambda item, follow_up: submitted.append(item), cancel=cancelled.append
    )
    service.settings = SimpleNamespace(request_timeout_s=60)  # type: ignore[assignment]

    async def leave_during_the_check() -> None:
        check = asyncio.create_task(service._with_p_true("question", "answer", None, None, deadline))  # type: ignore[arg-type]
        while not submitted:
            await asyncio.sleep(0.01)
        check.cancel()
        with pytest.raises(asyncio.CancelledError):
            await check

    deadline = time.monotonic() + 5.0  # the generation's: its check pass has no deadline of its own
    asyncio.run(leave_during_the_check())
    assert cancelled == submitted and len(submitted) == 1
    assert submitted[0].deadline == deadline  # type: ignore[attr-defined]
    # Only its trace is read: scored without TAD, so by no artifact (a reload may have replaced the load-time one).
    assert submitted[0].scorer is not None and not submitted[0].scorer.tad_available  # type: ignore[attr-defined]
