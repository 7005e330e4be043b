"""Training and serving see the same features: same builder, same stored trace, same confidences."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.uncertainty.artifact import load_artifact
from app.uncertainty.features import stage2_features, token_probabilities
from tests.app.service_client import make_client
from training.runs import iter_texts


def test_served_confidences_are_the_regressor_on_training_features(
    tiny_runs: dict[str, Path], tiny_artifact: Path
) -> None:
    """What the server computes per token is the trained regressor on the training builder's vectors."""
    artifact = load_artifact(tiny_artifact)
    scorer = artifact.tad
    assert scorer.split is not None  # the server's fast path, not the feature-vector one
    checked = 0
    for text in iter_texts([tiny_runs["dev"]]):
        if len(text) < 2:
            continue
        attention = np.asarray(text.attention)[..., : scorer.spec.n_lags]
        stream = scorer.stream()  # exactly what the server runs per token
        stream.advance(list(text.logprobs), list(attention))
        served = np.array(stream.confidences)
        trained = stage2_features(token_probabilities(text.logprobs), served, attention, scorer.spec)
        expected = np.clip(scorer.regressor.predict(trained), scorer.epsilon, 1.0)
        np.testing.assert_allclose(served[1:], expected, rtol=1e-12, atol=1e-15)
        checked += 1
    assert checked > 10


def test_server_reproduces_the_training_run(tiny_runs: dict[str, Path], tiny_artifact: Path, service_settings) -> None:
    """The server, given a training record's prompt, generates the stored answer with the same confidences."""
    from training.data import read_records
    from training.tasks import build_messages

    texts = [t for t in iter_texts([tiny_runs["dev"]]) if len(t) > 1][:4]
    assert len(texts) == 4
    records = {f"{r.dataset}/{r.record.id}": r.record for r in read_records([Path(t.meta["file"]) for t in texts])}
    artifact = load_artifact(tiny_artifact)
    with make_client(service_settings) as client:
        for text in texts:
            messages = build_messages(records[text.key])
            body = client.post("/v1/generate", json={"messages": messages, "max_new_tokens": 10}).json()
            assert [t["id"] for t in body["tokens"]] == text.token_ids.tolist()
            expected = artifact.tad.confidences(text.logprobs, np.asarray(text.attention)[..., : artifact.n_lags])
            assert [t["confidence"] for t in body["tokens"]] == pytest.approx(list(expected), abs=1e-5)
