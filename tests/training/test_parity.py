"""Training and serving see the same features: same builder, same stored trace, same confidences."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.uncertainty.artifact import load_artifact
from app.uncertainty.features import stage2_features, token_probabilities
from tests.app.service_client import make_client
from training.runs import iter_texts


def test_feature_vectors_are_bit_identical(tiny_runs: dict[str, Path], tiny_artifact: Path) -> None:
    artifact = load_artifact(tiny_artifact)
    spec = artifact.scorer.spec
    checked = 0
    for text in iter_texts([tiny_runs["dev"]]):
        if len(text) < 2:
            continue
        attention = np.asarray(text.attention)[..., : spec.n_lags]
        stream = artifact.scorer.stream(keep_features=True)  # exactly what the server runs per token
        stream.advance(list(text.logprobs), list(attention))
        served = np.stack(stream.features)
        trained = stage2_features(token_probabilities(text.logprobs), np.array(stream.confidences), attention, spec)
        assert served.tobytes() == trained.tobytes()
        checked += 1
    assert checked > 10


def test_server_reproduces_the_training_run(tiny_runs: dict[str, Path], tiny_artifact: Path, service_settings) -> None:
    """The server, given a training record's prompt, generates the stored answer with the same confidences."""
    from training.data import read_records
    from training.tasks import build_messages

    texts = [t for t in iter_texts([tiny_runs["dev"]]) if len(t) > 1][:4]
    records = {f"{r.dataset}/{r.record.id}": r.record for r in read_records([Path(t.meta["file"]) for t in texts])}
    artifact = load_artifact(tiny_artifact)
    with make_client(service_settings) as client:
        for text in texts:
            messages = build_messages(records[text.key])
            body = client.post("/v1/generate", json={"messages": messages, "max_new_tokens": 10}).json()
            assert [t["id"] for t in body["tokens"]] == text.token_ids.tolist()
            expected = artifact.scorer.confidences(text.logprobs, np.asarray(text.attention)[..., : artifact.n_lags])
            assert [t["confidence"] for t in body["tokens"]] == pytest.approx(list(expected), abs=1e-5)
