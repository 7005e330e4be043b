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


def log_decision(
    decision: Decision,
    *,
    request_id: str | None,
    kind: str,
    artifact: str | None,
    prompt_tokens: int,
    answer_tokens: int,
    **details: object,
) -> None:
    """`kind`: generate or score; `details`: e.g. the finish reason and timings of a generation."""
    if not logger.isEnabledFor(logging.INFO):
        return
    score = decision.score if decision.score is not None and math.isfinite(decision.score) else None
    record = {
        "event": "decision",
        "request_id": request_id,
        "kind": kind,
        "artifact": artifact,
        "prompt_tokens": prompt_tokens,
        "answer_tokens": answer_tokens,
        "accept": decision.accept,
        "withheld": decision.withheld,
        "method": decision.method.value,
        "score": score,
        "threshold": decision.threshold,
        "policy": decision.policy,
        **details,
    }
    logger.info(json.dumps(record, separators=(",", ":")))
