"""Property-based API testing against the app's own OpenAPI schema (bounded, loopback only).

Every generated request, valid or not, must get a non-5xx answer that matches the schema
declared for its status code; every schema-valid request must be accepted and every
schema-invalid one refused. The schema is the served deployment's own (`/openapi.json`),
which states its limits, model name and calibrated targets. The limits no JSON schema can
state are lengths in tokens (prompt, scored response): this server's are set high enough
that generated texts stay under them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

from app.settings import Settings
from tests.app.live_server import live_server


@pytest.fixture(scope="module")
def service_url(service_settings: Settings) -> Iterator[str]:
    limited = service_settings.model_copy(
        update={"max_new_tokens_limit": 256, "default_max_new_tokens": 4, "max_prompt_tokens": TINY_CONTEXT - 256}
    )
    with live_server(limited) as url:
        yield url


TINY_CONTEXT = 2048  # max_position_embeddings of the tiny test model
# 413 is a correct refusal of schema-invalid data too (e.g. many text parts at the length limit).
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "positive_data_acceptance": {"enabled": True},
            "negative_data_rejection": {"expected-statuses": [400, 401, 404, 405, 406, 413, 415, 422, 429]},
        }
    }
)


def _without_long_limits(node: object) -> object:
    """The schema without maxLength limits Hypothesis cannot exceed (it draws at most 8 KB).

    A looser schema only narrows what counts as invalid, so negative cases drawn from it are
    invalid under the real schema too; over-long texts are tested in test_errors.py.
    """
    if isinstance(node, dict):
        return {k: _without_long_limits(v) for k, v in node.items() if not (k == "maxLength" and v > 8000)}
    if isinstance(node, list):
        return [_without_long_limits(v) for v in node]
    return node


def test_api_conforms_to_its_schema(service_url: str) -> None:
    served = httpx.get(f"{service_url}/openapi.json").json()
    schemas = {
        GenerationMode.POSITIVE: schemathesis.openapi.from_dict(served, config=CONFIG),
        GenerationMode.NEGATIVE: schemathesis.openapi.from_dict(_without_long_limits(served), config=CONFIG),
    }
    checked = 0
    for mode, schema in schemas.items():
        for result in schema.get_all_operations():
            operation = result.ok()
            if mode is GenerationMode.NEGATIVE and (operation.method.upper() != "POST" or not len(operation.body)):
                continue  # a request without a body or parameters (a GET, the admin reload) has no invalid form
            checked += 1

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=30,
                deadline=None,
                # CI explores the same examples every run (no flaky stops); local runs explore new ones.
                derandomize=bool(os.environ.get("CI")),
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            def conforms(case) -> None:
                case.call_and_validate(base_url=service_url, timeout=60)

            conforms()
    assert checked >= 12
