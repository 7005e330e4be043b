"""Token details of native responses (app/api/native/format.py)."""

from __future__ import annotations

import math

import numpy as np

from app.api.native.format import TokenDetail, token_infos
from app.numeric import LOGPROB_FLOOR
from app.uncertainty.answer import AnswerScorer
from app.uncertainty.trace import TokenTrace


def test_a_token_of_probability_zero_has_the_floor_log_probability_as_on_the_openai_routes() -> None:
    # A model that masks tokens gives a scored answer's token logit -inf: JSON has no -inf, and null
    # would break the schema's number.
    stats = {"logprob": np.array([-0.5, -math.inf]), "entropy": np.array([1.0, 0.5])}
    trace = TokenTrace(token_ids=(7, 8), stats=stats, attention=None)
    scored = AnswerScorer(None).score(trace, None)
    detail = TokenDetail(text=str, bytes=lambda i: bytes([i]), top_logprobs=True)
    infos = token_infos(scored, detail, [((7, -0.5), (9, -math.inf)), ()])
    assert [info.logprob for info in infos] == [-0.5, LOGPROB_FLOOR]
    assert infos[0].top_logprobs is not None and infos[0].top_logprobs[1].logprob == LOGPROB_FLOOR
