"""Overloading the service: every request gets a final, declared answer, and the service stays ready."""

from __future__ import annotations

import asyncio

from app.settings import Settings
from benchmarks.loadtest import run_load
from tests.app.live_server import live_server


def test_overload_answers_everyone(service_settings: Settings) -> None:
    settings = service_settings.model_copy(update={"max_batch_size": 4, "max_queue": 4})
    with live_server(settings) as url:
        result = asyncio.run(run_load(url, requests=120, concurrency=40, max_new_tokens=8, timeout=60))
    assert sum(result.statuses.values()) == 120
    assert result.ok, result.report()
    assert result.statuses["200"] > 0 and result.statuses["429"] > 0
