"""Long texts are tokenized off the event loop, short ones on it."""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient

from app.serving.tokenizing import TOKENIZE_INLINE_CHARS


def test_a_long_text_is_tokenized_off_the_event_loop_and_a_short_one_on_it(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long text would stop the event loop (every stream, every disconnect check) while it is tokenized."""
    engine = client.app.state.runtime.engine  # type: ignore[attr-defined]
    threads: list[str] = []
    encode_prompt = engine.encode_prompt

    def recording(*args: object) -> list[int]:
        threads.append(threading.current_thread().name)
        return encode_prompt(*args)

    monkeypatch.setattr(engine, "encode_prompt", recording)
    short = client.post("/v1/generate", json={"prompt": "the capital of france", "max_new_tokens": 2})
    long = client.post("/v1/generate", json={"prompt": "x " * TOKENIZE_INLINE_CHARS, "max_new_tokens": 2})
    assert short.status_code == 200
    assert long.status_code == 422 and long.json()["error"]["param"] == "prompt"  # over the prompt limit, once counted
    assert not threads[0].startswith("tad-tokenize") and threads[1].startswith("tad-tokenize")
