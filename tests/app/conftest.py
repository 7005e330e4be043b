from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from tests.app.service_client import make_client


@pytest.fixture(scope="module")
def client(service_settings: Settings) -> Iterator[TestClient]:
    with make_client(service_settings) as test_client:
        yield test_client
