"""The routes' dependencies: coroutines, so that none costs a request a hop through FastAPI's thread pool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.to_thread
import pytest

from app.settings import Settings
from tests.app.service_client import CHAT, make_client


def test_a_generation_request_makes_no_thread_pool_hop(
    service_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FastAPI runs a plain `def` dependency on its thread pool: a thread hop per dependency per request,
    each needing the GIL back from the decode loop (docs/performance.md, Serving speed)."""
    hops: list[str] = []
    original = anyio.to_thread.run_sync

    async def counted(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(function, "__qualname__", repr(function)))
        return await original(function, *args, **kwargs)

    with make_client(service_settings, api_key="key") as client:
        monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
        for route, body in (
            ("/v1/generate", {"messages": CHAT, "max_new_tokens": 2}),
            (
                "/v1/chat/completions",
                {
                    "model": client.get("/v1/models", headers={"X-API-Key": "key"}).json()["data"][0]["id"],
                    "messages": CHAT,
                    "max_tokens": 2,
                },
            ),
        ):
            hops.clear()
            response = client.post(route, json=body, headers={"X-API-Key": "key"})
            assert response.status_code == 200, response.text
            assert hops == [], route
