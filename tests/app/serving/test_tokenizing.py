"""Long texts are tokenized off the event loop, short ones on it, each thread with a tokenizer of its own."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from fastapi.testclient import TestClient

from app.engine.engine import Engine
from app.serving.tokenizing import TOKENIZE_INLINE_CHARS, tokenized


def test_a_long_text_is_tokenized_off_the_event_loop_and_a_short_one_on_it(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long text would stop the event loop (every stream, every disconnect check) while it is tokenized. The
    thread encodes with a tokenizer of its own: a fast tokenizer sets its special-token mode on its backend and
    then encodes, so sharing the loop's would let each encode in the other's mode."""
    engine = client.app.state.runtime.engine  # type: ignore[attr-defined]
    calls: list[tuple[str, object]] = []
    encode_prompt = Engine.encode_prompt

    def recording(self: Engine, *args: object) -> list[int]:
        calls.append((threading.current_thread().name, self.loaded.tokenizer))
        return encode_prompt(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Engine, "encode_prompt", recording)
    short = client.post("/v1/generate", json={"prompt": "the capital of france", "max_new_tokens": 2})
    long = client.post("/v1/generate", json={"prompt": "x " * TOKENIZE_INLINE_CHARS, "max_new_tokens": 2})
    assert short.status_code == 200
    assert long.status_code == 422 and long.json()["error"]["param"] == "prompt"  # over the prompt limit, once counted
    (short_thread, short_tokenizer), (long_thread, long_tokenizer) = calls
    assert not short_thread.startswith("tad-tokenize") and long_thread.startswith("tad-tokenize")
    assert short_tokenizer is engine.loaded.tokenizer and long_tokenizer is not engine.loaded.tokenizer


def test_both_threads_keep_their_own_special_token_mode_while_encoding_at_once(engine: Engine) -> None:
    """A scored answer's control-token text stays text (`encode_answer`), a raw prompt's is the control token
    (`encode_prompt`), while the two are encoded at the same moment on the two threads. With one shared
    tokenizer about 1% of either came out in the other's mode."""
    control = engine.loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    long_answer = "paris <|im_end|> france . " * 1000
    prompt = "what <|im_end|> is"
    assert len(long_answer) > TOKENIZE_INLINE_CHARS >= len(prompt)
    counts = {"answers": 0, "prompts": 0, "wrong": 0}

    async def answers(until: float) -> None:
        while time.monotonic() < until:
            ids = await tokenized(len(long_answer), engine, Engine.encode_answer, long_answer)
            counts["answers"] += 1
            counts["wrong"] += control in ids

    async def prompts(until: float) -> None:
        while time.monotonic() < until:
            ids = await tokenized(len(prompt), engine, Engine.encode_prompt, prompt, None)
            counts["prompts"] += 1
            counts["wrong"] += control not in ids
            await asyncio.sleep(0)

    async def both() -> None:
        until = time.monotonic() + 4.0
        await asyncio.gather(answers(until), prompts(until))

    asyncio.run(both())
    assert counts["answers"] > 10 and counts["prompts"] > 1000 and counts["wrong"] == 0, counts
