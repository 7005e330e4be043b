"""Property-based API testing against the app's own OpenAPI schema (bounded, loopback only).

Every generated request, valid or not, must get a non-5xx answer that matches the schema
declared for its status code. `positive_data_acceptance` is left out on purpose: some
limits depend on the running service, not the schema (tokenised prompt length, the
configured max_new_tokens, the served model's name, the artifact's calibrated targets).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.config import SchemathesisConfig

from app.main import create_app
from app.settings import Settings
from tests.app.live_server import live_server


@pytest.fixture(scope="module")
def service_url(service_settings: Settings) -> Iterator[str]:
    limited = service_settings.model_copy(
        update={"max_new_tokens_limit": 8, "default_max_new_tokens": 4, "max_prompt_tokens": 256}
    )
    with live_server(limited) as url:
        yield url


# 413 is a correct refusal of schema-invalid data too (e.g. many text parts at the length limit).
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "positive_data_acceptance": {"enabled": False},
            "negative_data_rejection": {"expected-statuses": [400, 401, 404, 405, 406, 413, 415, 422, 429]},
        }
    }
)
# The schema does not depend on the loaded model: building the app loads nothing.
schema = schemathesis.openapi.from_dict(create_app(Settings(artifact_dir=None)).openapi(), config=CONFIG)


@schema.parametrize()
@settings(
    max_examples=60,
    deadline=None,
    # CI explores the same examples every run (no flaky stops); local runs explore new ones.
    derandomize=bool(os.environ.get("CI")),
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_its_schema(case, service_url: str) -> None:
    case.call_and_validate(base_url=service_url, timeout=60)
