"""Whether the model's recent steps say the replica is broken: only a restart mends it, so it leaves rotation."""

from __future__ import annotations

import logging
from typing import Literal

logger = logging.getLogger(__name__)

StepKind = Literal["decode", "prefill", "scoring"]


class StepFailures:
    """Runs of failed model steps (a forward: a decode step, a prefill or scoring chunk).

    Broken after `limit` failures in a row of any kind, no step succeeding between them (a CUDA error poisons
    the process's context), or after `limit` decode steps in a row failing with only prefills or scoring passes
    succeeding between them: each request's prefill succeeding must not hide a decode step that always fails
    (no generation can finish then). Scoring failing alone (a long pass out of memory) leaves generation up.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_a_row = 0
        self.decode_in_a_row = 0

    @property
    def broken(self) -> str | None:
        """Which steps all failed ("5 model", "5 decode"), or None."""
        if self.in_a_row >= self.limit:
            return f"{self.in_a_row} model"
        if self.decode_in_a_row >= self.limit:
            return f"{self.decode_in_a_row} decode"
        return None

    def record(self, kind: StepKind, succeeded: bool) -> None:
        """Count a step that ran the model (a pass that ran none, all its requests gone, proves nothing)."""
        was_broken = self.broken is not None
        if succeeded:
            self.in_a_row = 0
            if kind == "decode":
                self.decode_in_a_row = 0
            return
        self.in_a_row += 1
        if kind == "decode":
            self.decode_in_a_row += 1
        if self.broken is not None and not was_broken:
            logger.error(
                "%s steps failed in a row: this replica reports itself broken (/ready and /health 503) until it "
                "is restarted",
                self.broken,
            )
