"""When failed model steps make a replica report itself broken."""

from __future__ import annotations

from app.serving.step_failures import StepFailures


def test_failures_of_any_kind_in_a_row_break_it_and_any_success_between_them_does_not() -> None:
    failures = StepFailures(limit=3)
    for kind in ("prefill", "scoring"):
        failures.record(kind, succeeded=False)
    failures.record("decode", succeeded=True)
    failures.record("scoring", succeeded=False)
    assert failures.broken is None
    failures.record("prefill", succeeded=False)
    failures.record("decode", succeeded=False)
    assert failures.broken == "3 model"


def test_decode_steps_failing_with_only_prefills_succeeding_between_them_break_it() -> None:
    failures = StepFailures(limit=3)
    for _ in range(3):
        failures.record("prefill", succeeded=True)  # each request's prefill: the first token comes
        failures.record("decode", succeeded=False)  # and no answer ever finishes
    assert failures.broken == "3 decode"


def test_scoring_failing_alone_leaves_a_replica_that_generates_in() -> None:
    failures = StepFailures(limit=3)
    for _ in range(5):
        failures.record("scoring", succeeded=False)  # a long pass out of memory, say
        failures.record("decode", succeeded=True)
    assert failures.broken is None
    failures.record("decode", succeeded=False)
    failures.record("decode", succeeded=True)  # a decode success ends a run of decode failures
    assert failures.decode_in_a_row == 0
