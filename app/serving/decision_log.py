"""One JSON line per decision (logger `tad.decisions`): what was decided about which request, never its text.

Operators read it to answer "why was this answer rejected?" for a client's request id, and to
audit the gate over time without storing prompts or answers.
"""

from __future__ import annotations

import json
import logging

from app.numeric import finite_or_none
from app.serving.policy import Decision

logger = logging.getLogger("tad.decisions")


def log_decision(
    decision: Decision,
    *,
    request_id: str | None,
    kind: str,
    artifact: str | None,
    manifest_sha256: str | None,
    prompt_tokens: int,
    answer_tokens: int,
    **details: object,
) -> None:
    """`kind`: generate or score; `manifest_sha256`: the manifest's hash, which tells artifact versions apart
    where the name (its folder's) stays the same across a reload; `details`: e.g. the finish reason and
    timings of a generation."""
    if not logger.isEnabledFor(logging.INFO):
        return
    record = {
        "event": "decision",
        "request_id": request_id,
        "kind": kind,
        "artifact": artifact,
        "manifest_sha256": manifest_sha256,
        "prompt_tokens": prompt_tokens,
        "answer_tokens": answer_tokens,
        "accept": decision.accept,
        "withheld": decision.withheld,
        "method": decision.method.value,
        "score": finite_or_none(decision.score),
        "threshold": finite_or_none(decision.threshold),
        "policy": decision.policy,
        **details,
    }
    logger.info(json.dumps(record, separators=(",", ":")))
