"""Where the decode loop's host time goes, phase by phase: off unless `TAD_PHASE_TIMING=1`.

The worker thread runs one phase after another, so one clock marks the boundaries: `lap(phase)`
adds the time since the previous lap to `phase`. Every moment of the worker's time lands in
exactly one phase (none counted twice, none lost), each boundary costs one `perf_counter` call,
and with timing off `CLOCK` is None, so the hot path pays one attribute read and an `is None`
test per boundary. Benchmarks read and reset the totals (`benchmarks/serving.py`).

Times are the worker's wall-clock time: on a GPU a phase that only queues kernels is short and
the wait for the device lands in the phase that first reads a result (the token choice); on a
shared CPU a phase also holds the time the thread waited for a core or for the GIL.
"""

from __future__ import annotations

import os
import time

IDLE = "idle"  # waiting for requests
SCHEDULER = "scheduler"  # admission, queues, cancellation and deadline checks, the step's inputs
PREFILL = "prefill"  # prompts' forwards (whole or a chunk)
FORWARD = "forward"  # the decode step's model call (the capture's per-layer stores included)
CAPTURE = "capture"  # TAD's rows: the batched weights, their copy to the host, appending them
SAMPLING = "sampling"  # reading the greedy choices, drawing tokens, token records, stop tokens and strings
TOKEN_STATS = "token_stats"  # log-softmax and the per-token statistics, and their copy to the host
SCORING = "scoring"  # per-step observers (TAD streams, early stop), and each finished answer's scores
BATCH = "batch"  # sequences leaving and joining: final texts, trimming and merging caches
HANDOFF = "handoff"  # events handed to the event loop

PHASES = (SCHEDULER, PREFILL, FORWARD, CAPTURE, SAMPLING, TOKEN_STATS, SCORING, BATCH, HANDOFF, IDLE)


class PhaseClock:
    """Seconds per phase since the last `reset`, and the number of decode steps among them."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.decode_steps = 0
        self.decode_rows = 0  # rows computed by those steps (their mean is the batch a step ran)
        self._mark = time.perf_counter()

    def lap(self, phase: str) -> None:
        """The time since the previous lap (or `mark`) was spent in `phase`."""
        now = time.perf_counter()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self._mark
        self._mark = now

    def mark(self) -> None:
        """Start the next lap now, counting the time since the last one nowhere."""
        self._mark = time.perf_counter()

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.decode_steps = 0
        self.decode_rows = 0

    def snapshot(self) -> dict[str, object]:
        return {"seconds": dict(self.seconds), "decode_steps": self.decode_steps, "decode_rows": self.decode_rows}


def lap(phase: str) -> None:
    """The worker's time since the last lap went to `phase` (when timing is on)."""
    if CLOCK is not None:
        CLOCK.lap(phase)


def enabled_by_environment() -> bool:
    return os.environ.get("TAD_PHASE_TIMING", "") == "1"


CLOCK: PhaseClock | None = PhaseClock() if enabled_by_environment() else None
"""The worker's clock, or None (timing off). Read it as `phase_timing.CLOCK` at the call, not imported by
name, so that a benchmark or a test can switch it on in a running process."""
