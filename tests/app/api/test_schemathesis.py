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
from collections.abc import Callable, Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.generation.drivers import CoverageGenerator
from schemathesis.generation.feedback import FeedbackSources
from schemathesis.generation.overrides import Override
from schemathesis.schemas import BaseSchema

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


def _without(node: object, drop: Callable[[str, object], bool], keywords: bool = True) -> object:
    """The schema without the keywords `drop` picks (a property's name is never a keyword)."""
    if isinstance(node, dict):
        return {
            k: _without(v, drop, keywords=k != "properties") for k, v in node.items() if not (keywords and drop(k, v))
        }
    if isinstance(node, list):
        return [_without(v, drop) for v in node]
    return node


HYPOTHESIS_TEXT = 8000  # the longest text Hypothesis draws


def _without_long_limits(node: object) -> object:
    """The schema without maxLength limits Hypothesis cannot exceed (it draws at most 8 KB).

    A looser schema only narrows what counts as invalid, so negative cases drawn from it are
    invalid under the real schema too; over-long texts are tested in test_errors.py and by the
    coverage phase below.
    """
    return _without(node, lambda k, v: k == "maxLength" and isinstance(v, int) and v > HYPOTHESIS_TEXT)


def _without_patterns(node: object) -> object:
    return _without(node, lambda k, v: k == "pattern")


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


def _coverage_cases(schema: BaseSchema, modes: list[GenerationMode]) -> Iterator[Case]:
    """Schemathesis's coverage phase for every operation, as its CLI builds it.

    Its pytest plugin (`schema.parametrize()`), which runs this phase too, fails under pytest 9.2 (it
    uses `Function._nodeid`, which pytest no longer has), so the cases come from the generator the CLI uses.
    """
    for result in schema.get_all_operations():
        operation = result.ok()
        generation = schema.config.generation_for(operation=operation, phase="coverage")
        yield from CoverageGenerator(
            operation=operation,
            generation_modes=modes,
            generation_config=generation,
            auth_storage=None,
            override=Override(),
            feedback=FeedbackSources(),
        )


def _longest_text(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        value = list(value.values())
    return max((_longest_text(v) for v in value), default=0) if isinstance(value, list) else 0


def test_boundary_values_conform_to_the_schema(service_url: str) -> None:
    """The coverage phase: cases built (not drawn) at and just past every bound the schema declares
    (minimum, maximum, lengths, item counts, enums, required fields), each field alone and beside the
    others, checked as above. Random fuzzing rarely lands on a bound: `max_tokens` one past its limit
    beside `max_completion_tokens` passed the fuzzing above, and an outside run's coverage phase found it.
    """
    served = httpx.get(f"{service_url}/openapi.json").json()
    # A text up to 200,000 characters that must match a pattern takes schemathesis minutes to build
    # cases for (and it gives up on most of them); without the long limits, all the rest take seconds.
    bounded = schemathesis.openapi.from_dict(_without_long_limits(served), config=CONFIG)
    cases = list(_coverage_cases(bounded, [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]))
    # The long limits themselves: negative cases from the schema without its patterns (looser, so they are
    # invalid under the real schema too), those past a long limit; the others are much like the cases above.
    unpatterned = schemathesis.openapi.from_dict(_without_patterns(served), config=CONFIG)
    long_cases = [
        case
        for case in _coverage_cases(unpatterned, [GenerationMode.NEGATIVE])
        if _longest_text(case.body) > HYPOTHESIS_TEXT
    ]
    assert len(long_cases) >= 4, "no case past the 200,000-character limits"
    for case in cases + long_cases:
        case.call_and_validate(base_url=service_url, timeout=60)
    assert {case.operation.path for case in cases} >= {"/v1/generate", "/v1/score", "/v1/chat/completions"}
