from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from tests.app.service_client import make_client
from tests.fixtures.tiny_model import write_tiny_model


@pytest.fixture(scope="module")
def client(service_settings: Settings) -> Iterator[TestClient]:
    with make_client(service_settings) as test_client:
        yield test_client


@pytest.fixture(scope="session")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Big enough that 1,500 tokens take seconds, and greedy never emits a stop token."""
    return write_tiny_model(tmp_path_factory.mktemp("slow") / "model", hidden_size=256, num_layers=4, stop_scale=0.0)
