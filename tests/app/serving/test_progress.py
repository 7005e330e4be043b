"""An answer's progress: a streamed answer's confidences are computed once, as its tokens arrive."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from app.settings import Settings
from app.uncertainty.tad import TadScorer
from tests.app.api.native.test_streaming import read_events
from tests.app.service_client import CHAT, make_client
from tests.artifacts import as_mlp_artifact

QUESTIONS = ("What is the capital of France?", "Name a prime number.", "Who wrote Hamlet?")


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
    # Scored a token at a time and as one block: the same up to the order of a product's sums.
    assert streamed == pytest.approx([token["confidence"] for token in plain["tokens"]], rel=1e-12)
    assert events[-1][1]["uncertainty"] == plain["uncertainty"]


def test_streams_of_one_step_share_one_mlp_product_and_get_the_confidences_of_whole_answers(
    service_settings: Settings, tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.uncertainty.tad import MLPStage2

    artifact = as_mlp_artifact(tiny_artifact, tmp_path / "averaged", averaged=True)
    answers_per_product: list[int] = []
    original = MLPStage2.attention_terms_of

    def recording(self: MLPStage2, answers: list, row_shift: int) -> list[np.ndarray]:
        answers_per_product.append(len(answers))
        return original(self, answers, row_shift)

    monkeypatch.setattr(MLPStage2, "attention_terms_of", recording)
    # A long batch window: the three requests start together, so every step streams all three.
    settings = service_settings.model_copy(update={"artifact_dir": artifact, "batch_window_ms": 500.0})
    payloads = [{"messages": [{"role": "user", "content": q}], "max_new_tokens": 12} for q in QUESTIONS]
    with make_client(settings) as client, ThreadPoolExecutor(len(payloads)) as pool:
        streams = list(pool.map(lambda p: read_events(client, {**p, "stream": True}), payloads))
        # The same three batched together again, not streamed (a batch of one would compute other logits
        # in the last bits): each answer's confidences from one product over the whole answer.
        plain = list(pool.map(lambda p: client.post("/v1/generate", json=p).json(), payloads))
    # Every decode step while all three streamed took one product for their three new tokens (a whole
    # answer, scored when it ends, takes one of its own).
    shortest = min(sum(name == "token" for name, _ in events) for events in streams)
    assert shortest > 3 and answers_per_product.count(len(payloads)) >= shortest - 1
    for events, whole in zip(streams, plain, strict=True):
        streamed = [data["confidence"] for name, data in events if name == "token"]
        assert len(streamed) == len(whole["tokens"]) > 2
        assert len(set(streamed[1:])) > 1 and all(1e-4 < c < 1.0 for c in streamed[1:])  # nothing clipped
        np.testing.assert_allclose(streamed, [t["confidence"] for t in whole["tokens"]], rtol=1e-12, atol=0)
