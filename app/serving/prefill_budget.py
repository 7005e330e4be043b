"""How many prompt tokens a prefill or scoring pass may run between two decode steps.

A fixed budget (`TAD_PREFILL_CHUNK_TOKENS=<n>`) is a number of tokens, but what running answers feel
is time: the pause a pass puts between two of their tokens. The same 512 tokens hold a 1.5B model's
answers for seconds on a CPU and a tiny model's for 12 ms, where 4,096 would still pause them less
than 100 ms and batch a burst of prompts as plain `generate` does. So the default (`auto`) measures
the passes the worker runs and sizes the next one to fit in `TAD_PREFILL_PAUSE_MS`: tokens per second
of the recent passes, times the pause, kept within [`AUTO_MIN_TOKENS`, `AUTO_MAX_TOKENS`].

Never under 512 tokens, as a fixed default: below that a pass is mostly per-forward overhead, and a
burst of prompts would take more passes, each a pause, than it gains in shorter ones. Never over 8,192
(vLLM's budget on large GPUs): a pass's activations grow with it. Passes under `MIN_MEASURED_TOKENS`
are not measured: one short chat prompt's forward is mostly fixed overhead, and its rate would say
nothing about a long prompt's.
"""

from __future__ import annotations

from typing import Literal

AUTO = "auto"
DEFAULT_PREFILL_PAUSE_S = 0.1
AUTO_MIN_TOKENS = 512
AUTO_MAX_TOKENS = 8192
MIN_MEASURED_TOKENS = 256
# Weight of the newest pass in the rate: a few passes follow a change of load, one slow pass (the machine
# busy elsewhere for a moment) does not halve the budget for long.
NEWEST_WEIGHT = 0.5


class PrefillBudget:
    """The budget for the next pass (`tokens`), updated from each pass the worker runs (`observe`).

    Written and read by the scheduler's worker only; `tokens` is read by the metrics too (an int read)."""

    def __init__(self, setting: int | Literal["auto"], pause_s: float) -> None:
        """`setting`: a fixed number of tokens (0: every pass whole, no chunking) or `auto`; `pause_s`: with
        `auto`, how long a pass may hold running answers."""
        if pause_s <= 0:
            raise ValueError("the prefill pause must be > 0 seconds")
        self.pause_s = pause_s
        self.tokens_per_s: float | None = None  # measured (auto only)
        self.tokens: int | None
        if setting == AUTO:
            self.auto, self.tokens = True, AUTO_MIN_TOKENS
        elif isinstance(setting, int) and not isinstance(setting, bool) and setting >= 0:
            self.auto, self.tokens = False, setting or None
        else:
            raise ValueError(f"a prefill budget is a number of tokens >= 0 or {AUTO!r}, not {setting!r}")

    def observe(self, tokens: int, seconds: float) -> None:
        """A pass ran `tokens` prompt tokens (rows x columns, padding included) in `seconds`."""
        if not self.auto or tokens < MIN_MEASURED_TOKENS or seconds <= 0:
            return
        rate = tokens / seconds
        previous = self.tokens_per_s
        self.tokens_per_s = rate if previous is None else NEWEST_WEIGHT * rate + (1 - NEWEST_WEIGHT) * previous
        self.tokens = min(AUTO_MAX_TOKENS, max(AUTO_MIN_TOKENS, int(self.tokens_per_s * self.pause_s)))
