"""An answer's progress: a streamed answer's confidences are computed once, as its tokens arrive."""

from __future__ import annotations

import numpy as np
import pytest

from app.settings import Settings
from app.uncertainty.tad import TadScorer
from tests.app.api.native.test_streaming import read_events
from tests.app.service_client import CHAT, make_client


def test_a_streamed_answer_is_not_scored_again_when_it_ends(
    service_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole_answer_scorings: list[int] = []
    original = TadScorer.confidences_of

    def counted(self: TadScorer, trace: object) -> np.ndarray:
        whole_answer_scorings.append(1)
        return original(self, trace)  # type: ignore[arg-type]

    monkeypatch.setattr(TadScorer, "confidences_of", counted)
    payload = {"messages": CHAT, "max_new_tokens": 8}
    with make_client(service_settings) as client:
        events = read_events(client, {**payload, "stream": True})
        assert events[-1][0] == "final" and whole_answer_scorings == []
        streamed = [data["confidence"] for name, data in events if name == "token"]
        plain = client.post("/v1/generate", json=payload).json()
    assert len(whole_answer_scorings) == 1  # the answer that was not streamed is scored when it ends
    assert streamed == [token["confidence"] for token in plain["tokens"]]
    assert events[-1][1]["uncertainty"] == plain["uncertainty"]
