"""Running the service on the tiny model inside a test (FastAPI's TestClient, lifespan included)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

CHAT = [{"role": "user", "content": "what is the capital of france ?"}]
OPENAI_ROUTES = ("/v1/chat/completions", "/v1/completions")


def invalid_status(route: str) -> int:
    """An invalid request's status: 400 on the OpenAI routes (OpenAI's, and vLLM's), 422 on the native ones."""
    return 400 if route in OPENAI_ROUTES else 422


def wait_ready(client: TestClient, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/ready").status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError(f"service not ready: {client.get('/ready').json()}")


@contextmanager
def make_client(
    settings: Settings, ready: bool = True, *, raise_server_exceptions: bool = True, **overrides: Any
) -> Iterator[TestClient]:
    """`raise_server_exceptions=False` lets an unhandled error come back as the 500 a client would get."""
    app = create_app(Settings(**{**settings.model_dump(), **overrides}))
    with TestClient(app, raise_server_exceptions=raise_server_exceptions) as client:
        if ready:
            wait_ready(client)
        yield client


def long_chat(client: TestClient, tokens: int) -> list[dict[str, str]]:
    """Chat messages the (random) tiny model answers with at least `tokens` tokens before any stop token."""
    for word in ("france", "river", "king", "ocean", "planet", "city", "queen", "moon", "island", "star"):
        messages = [{"role": "user", "content": f"what is the biggest {word} ?"}]
        body = client.post("/v1/generate", json={"messages": messages, "max_new_tokens": tokens}).json()
        if body["finish_reason"] == "length":
            return messages
    raise AssertionError(f"no test prompt runs to {tokens} tokens")
