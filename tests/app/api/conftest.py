from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

CHAT = [{"role": "user", "content": "what is the capital of france ?"}]


def wait_ready(client: TestClient, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get("/ready").status_code == 200:
            return
        time.sleep(0.05)
    raise AssertionError(f"service not ready: {client.get('/ready').json()}")


@pytest.fixture(scope="session")
def service_settings(tiny_model_dir: Path, tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        model=str(tiny_model_dir),
        artifact_dir=tiny_artifact,
        cache_dir=tmp_path_factory.mktemp("cache"),
        default_max_new_tokens=8,
        max_new_tokens_limit=32,
        max_prompt_tokens=200,
        batch_window_ms=2.0,
    )


@contextmanager
def make_client(settings: Settings, ready: bool = True, **overrides: Any) -> Iterator[TestClient]:
    app = create_app(settings.model_copy(update=overrides))
    with TestClient(app) as client:
        if ready:
            wait_ready(client)
        yield client


@pytest.fixture(scope="module")
def client(service_settings: Settings) -> Iterator[TestClient]:
    with make_client(service_settings) as test_client:
        yield test_client
