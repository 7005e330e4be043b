"""One JSON line per decision (logger `tad.decisions`): what was decided about which request, never its text.

Operators read it to answer "why was this answer rejected?" for a client's request id, and to
audit the gate over time without storing prompts or answers.
"""

from __future__ import annotations

import json
import logging
import math

from app.serving.policy import Decision

logger = logging.getLogger("tad.decisions")


def _finite(value: float | None) -> float | None:
    # JSON has no NaN or Infinity (json.dumps would write them anyway, and log parsers would choke).
    return value if value is not None and math.isfinite(value) else None


def log_decision(
    decision: Decision,
    *,
    request_id: str | None,
    kind: str,
    artifact: str | None,
    artifact_sha256: str | None,
    prompt_tokens: int,
    answer_tokens: int,
    **details: object,
) -> None:
    """`kind`: generate or score; `artifact_sha256`: the manifest's hash, which tells artifact versions apart
    where the name (its folder's) stays the same across a reload; `details`: e.g. the finish reason and
    timings of a generation."""
    if not logger.isEnabledFor(logging.INFO):
        return
    record = {
        "event": "decision",
        "request_id": request_id,
        "kind": kind,
        "artifact": artifact,
        "artifact_sha256": artifact_sha256,
        "prompt_tokens": prompt_tokens,
        "answer_tokens": answer_tokens,
        "accept": decision.accept,
        "withheld": decision.withheld,
        "method": decision.method.value,
        "score": _finite(decision.score),
        "threshold": _finite(decision.threshold),
        "policy": decision.policy,
        **details,
    }
    logger.info(json.dumps(record, separators=(",", ":")))
