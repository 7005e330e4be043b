"""`TAD_COMPILED_DECODE_LENGTH` through the service on a CPU: the step compiled before ready, the same answers."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from tests.app.service_client import CHAT, make_client, wait_ready


def test_info_says_the_step_is_eager_and_why(client: TestClient) -> None:
    assert client.get("/info").json()["decode_step"] == {
        "mode": "eager",
        "slot_length": None,
        "why_eager": "compiled decoding is off",
    }


def test_a_compiled_step_answers_as_the_eager_loop_and_caps_the_context(
    client: TestClient, service_settings: Settings
) -> None:
    # A prompt long enough for the shortest slot the settings allow (128) to be just room for its answer.
    long_chat = [{"role": "user", "content": CHAT[-1]["content"] + " and" * 120}]
    body = {"messages": long_chat, "max_new_tokens": 8, "return_tokens": True}
    eager = client.post("/v1/generate", json=body).json()
    slot = eager["usage"]["prompt_tokens"] + 8 + 1  # just room for this answer (its last token is fed once more)
    assert slot >= 128
    with make_client(service_settings, ready=False, compiled_decode_length=slot) as compiled_client:
        wait_ready(compiled_client, timeout=300.0)  # compiling the step (seconds; more on a cold cache)
        assert compiled_client.get("/info").json()["decode_step"] == {
            "mode": "compiled",
            "slot_length": slot,
            "why_eager": None,
        }
        assert compiled_client.get("/info").json()["limits"]["context_tokens"] == slot - 1  # what the slot caps
        compiled = compiled_client.post("/v1/generate", json=body).json()
        too_long = compiled_client.post("/v1/generate", json={**body, "max_new_tokens": 9})
    assert eager["tokens"] and [t["id"] for t in compiled["tokens"]] == [t["id"] for t in eager["tokens"]]
    for method, value in eager["uncertainty"].items():
        if value is not None:
            assert compiled["uncertainty"][method] == pytest.approx(value, abs=1e-5), method
    assert too_long.status_code == 422 and too_long.json()["error"]["param"] == "max_new_tokens"
