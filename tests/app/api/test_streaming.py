"""The one streaming path: a stream with nothing to send for a while keeps its connection alive."""

from __future__ import annotations

from pathlib import Path

from app.settings import RejectAction, Settings
from tests.app.service_client import make_client


def raw_lines(settings: Settings, slow_model: Path, action: str, keep_alive_s: float) -> list[str]:
    """A long rejected answer's stream, line by line."""
    overrides = {
        "model": str(slow_model),
        "artifact_dir": None,  # baselines decide: the fallback threshold rejects every answer
        "fallback_threshold": -1.0,
        "max_new_tokens_limit": 1500,
        "stream_keepalive_s": keep_alive_s,
        "reject_action": RejectAction.WITHHOLD,
    }
    with make_client(settings, **overrides) as client:
        request = {"prompt": "the", "max_new_tokens": 500, "stream": True, "policy": {"action": action}}
        with client.stream("POST", "/v1/generate", json=request) as response:
            assert response.status_code == 200
            return [line for line in response.iter_lines() if line]


def test_a_held_stream_sends_keep_alives_until_its_final_event(service_settings: Settings, slow_model: Path) -> None:
    lines = raw_lines(service_settings, slow_model, "withhold", keep_alive_s=0.1)
    events = [line for line in lines if line.startswith("event: ")]
    assert events == ["event: final"]  # withheld: no token was sent
    assert lines.count(": keep-alive") >= 2  # the 500 tokens take a second or more


def test_a_stream_sending_tokens_needs_no_keep_alive(service_settings: Settings, slow_model: Path) -> None:
    # Tokens come every few ms: a keep-alive here would mean a sent token did not count as traffic.
    lines = raw_lines(service_settings, slow_model, "flag", keep_alive_s=0.5)
    assert lines.count("event: token") == 500 and ": keep-alive" not in lines
