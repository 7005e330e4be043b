"""The decode loop's phase clock: off by default, and when on every moment of a generation lands in a phase."""

from __future__ import annotations

import time

import pytest

from app.engine import phase_timing
from app.engine.engine import Engine
from app.engine.phase_timing import FORWARD, PHASES, PREFILL, SAMPLING, TOKEN_STATS, PhaseClock
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest


def test_off_unless_the_environment_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAD_PHASE_TIMING", raising=False)
    assert not phase_timing.enabled_by_environment()
    monkeypatch.setenv("TAD_PHASE_TIMING", "1")
    assert phase_timing.enabled_by_environment()


def test_a_generation_is_split_into_phases_that_add_up_to_its_time(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = PhaseClock()
    monkeypatch.setattr(phase_timing, "CLOCK", clock)
    requests = [
        GenerationRequest((5, 6, 7), SamplingParams(max_new_tokens=6)),
        GenerationRequest((8,), SamplingParams(max_new_tokens=6)),
    ]
    # The laps cover exactly mark() to the last lap(): more than the generation alone, less than the time
    # around both calls (inequalities a preempted test thread cannot break, unlike a tolerance).
    outer_start = time.perf_counter()
    clock.mark()
    inner_start = time.perf_counter()
    sequences = engine.generate(requests)
    inner = time.perf_counter() - inner_start
    clock.lap(phase_timing.BATCH)  # what ran after the last lap
    outer = time.perf_counter() - outer_start
    assert all(len(sequence.tokens) > 0 for sequence in sequences)
    steps = max(len(sequence.tokens) for sequence in sequences) - 1
    assert steps <= clock.decode_steps <= steps + 1  # + the step of the last token's own row, if any
    assert clock.decode_rows >= clock.decode_steps
    for phase in (PREFILL, FORWARD, SAMPLING, TOKEN_STATS):
        assert clock.seconds[phase] > 0, phase
    assert set(clock.seconds) == set(PHASES)
    assert inner <= sum(clock.seconds.values()) <= outer
    snapshot = clock.snapshot()
    clock.reset()
    assert snapshot["decode_steps"] > 0 and clock.decode_steps == 0 and not any(clock.seconds.values())
