"""JSON has no NaN or infinity: the one place that decides what a non-finite number becomes."""

from __future__ import annotations

import math
from typing import Any

# OpenAI clients expect a number for a log-probability; a token the model gave probability 0
# (logit -inf) is reported at this floor instead.
LOGPROB_FLOOR = -1e30


def finite_or_none(value: float | None) -> float | None:
    """A float for JSON, or None where it is missing or not finite (e.g. the score of an empty answer)."""
    return None if value is None or not math.isfinite(value) else float(value)


def logprob_or_floor(value: float) -> float:
    return value if math.isfinite(value) else LOGPROB_FLOOR


def finite_tree(value: Any) -> Any:
    """`value` with every non-finite float inside dicts, lists and tuples replaced by None."""
    if isinstance(value, float):
        return finite_or_none(value)
    if isinstance(value, dict):
        return {key: finite_tree(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_tree(item) for item in value]
    return value
