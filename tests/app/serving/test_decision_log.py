"""The decision log line: valid JSON whatever the numbers, and the artifact version beside its name."""

from __future__ import annotations

import json
import logging
import math

import pytest

from app.serving.decision_log import log_decision
from app.serving.policy import Decision
from app.uncertainty.methods import Method


@pytest.mark.parametrize("threshold", [math.inf, -math.inf, math.nan])
def test_a_line_stays_json_when_a_number_is_not_finite(caplog: pytest.LogCaptureFixture, threshold: float) -> None:
    caplog.set_level(logging.INFO, logger="tad.decisions")
    decision = Decision(accept=True, method=Method.TAD, score=math.inf, threshold=threshold, policy="fixed")
    log_decision(
        decision, request_id="r", kind="score", artifact="a", manifest_sha256="ab12", prompt_tokens=3, answer_tokens=2
    )
    (line,) = [r.getMessage() for r in caplog.records if r.name == "tad.decisions"]
    record = json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert record["score"] is None and record["threshold"] is None
    assert record["artifact"] == "a" and record["manifest_sha256"] == "ab12"
