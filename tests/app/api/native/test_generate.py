"""/v1/generate and /v1/score through HTTP with the tiny model and a tiny trained artifact."""

from __future__ import annotations

import dataclasses
import math

import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from tests.app.service_client import CHAT, invalid_status, long_chat, make_client

METHODS = ("tad", "msp", "perplexity", "mean_token_entropy")


def test_generate_returns_every_field(client: TestClient) -> None:
    response = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 6})
    assert response.status_code == 200
    body = response.json()
    assert body["finish_reason"] in ("stop", "length")
    # Usage counts the stop token too (no stop strings here); the tokens are the answer's.
    assert body["usage"]["completion_tokens"] == len(body["tokens"]) + (body["finish_reason"] == "stop") > 0
    assert body["usage"]["prompt_tokens"] > 0
    assert body["model"] == "model" and body["artifact"] == "tiny-tad" and body["tad_available"]
    assert body["seed"] is None  # greedy
    for token in body["tokens"]:
        assert {"id", "text", "logprob", "entropy", "confidence", "uncertainty"} <= token.keys()
        assert token["logprob"] <= 0 and token["entropy"] >= 0
        assert 0 < token["confidence"] <= 1 and token["uncertainty"] == pytest.approx(1 - token["confidence"])
    assert all(math.isfinite(body["uncertainty"][m]) for m in METHODS)
    decision = body["decision"]
    assert decision["method"] == "tad" and decision["policy"].startswith("calibrated:")
    assert decision["score"] == pytest.approx(body["uncertainty"]["tad"])
    assert decision["accept"] == (decision["score"] <= decision["threshold"])


def test_greedy_is_deterministic_and_prompt_works(client: TestClient) -> None:
    first = client.post("/v1/generate", json={"prompt": "the capital of", "max_new_tokens": 5}).json()
    second = client.post("/v1/generate", json={"prompt": "the capital of", "max_new_tokens": 5}).json()
    assert first["text"] == second["text"] and first["uncertainty"] == second["uncertainty"]


def test_sampling_seed_is_echoed_and_reproduces(client: TestClient) -> None:
    request = {"prompt": "the capital of", "max_new_tokens": 8, "temperature": 1.0}
    drawn = client.post("/v1/generate", json=request).json()
    assert isinstance(drawn["seed"], int)
    again = client.post("/v1/generate", json={**request, "seed": drawn["seed"]}).json()
    assert again["text"] == drawn["text"] and again["seed"] == drawn["seed"]


def test_score_equals_generate(client: TestClient) -> None:
    generated = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 10}).json()
    scored = client.post("/v1/score", json={"messages": CHAT, "response": generated["text"]}).json()
    assert [t["id"] for t in scored["tokens"]] == [t["id"] for t in generated["tokens"]]
    for a, b in zip(scored["tokens"], generated["tokens"], strict=True):
        for key in ("logprob", "entropy", "confidence"):
            assert a[key] == pytest.approx(b[key], abs=1e-5)
    for method in METHODS:
        assert scored["uncertainty"][method] == pytest.approx(generated["uncertainty"][method], abs=1e-5)
    assert scored["decision"]["accept"] == generated["decision"]["accept"]


def test_policy_override(client: TestClient) -> None:
    base = {"messages": CHAT, "max_new_tokens": 5}
    accept = client.post("/v1/generate", json={**base, "policy": {"threshold": 1e9}}).json()["decision"]
    reject = client.post("/v1/generate", json={**base, "policy": {"method": "msp", "threshold": -1}}).json()["decision"]
    assert accept["accept"] and accept["policy"] == "fixed" and accept["method"] == "tad"
    assert not reject["accept"] and reject["method"] == "msp" and reject["threshold"] == -1
    calibrated = client.post("/v1/generate", json={**base, "policy": {"target": "coverage@0.8"}}).json()["decision"]
    assert calibrated["policy"] == "calibrated:coverage@0.8"
    unknown = client.post("/v1/generate", json={**base, "policy": {"target": "error@0.01"}})
    assert unknown.status_code == 422 and unknown.json()["error"]["param"] == "policy.target"


def test_usage_counts_the_stop_token_that_ended_the_answer(client: TestClient) -> None:
    """As vLLM counts generated tokens: the stop token is not among the answer's tokens, but it was generated.
    The tiny model's stop tokens are rare, not impossible: some seed's hot sampling chooses one."""
    request = {"prompt": "the", "max_new_tokens": 24, "temperature": 1.5}
    answers = (client.post("/v1/generate", json={**request, "seed": seed}).json() for seed in range(64))
    ended = next((body for body in answers if body["finish_reason"] == "stop"), None)
    assert ended is not None, "no seed ended on a stop token: raise the temperature"
    assert ended["usage"]["completion_tokens"] == len(ended["tokens"]) + 1


def test_return_tokens_false(client: TestClient) -> None:
    body = client.post("/v1/generate", json={"prompt": "the", "max_new_tokens": 3, "return_tokens": False}).json()
    assert body["tokens"] is None and body["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(
    ("route", "extra", "field"),
    [
        ("/v1/generate", {"max_new_tokens": 2, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/generate", {"max_new_tokens": 2, "return_attention": True}, "return_attention"),
        ("/v1/score", {"response": "Paris."}, "return_attention"),
    ],
)
def test_token_details_without_tokens_are_refused(client: TestClient, route: str, extra: dict, field: str) -> None:
    request = {"messages": CHAT, "return_tokens": False, "return_attention": route == "/v1/score", **extra}
    response = client.post(route, json=request)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["param"] == field and "return_tokens" in error["message"]


def test_early_stop_on_uncertainty(client: TestClient) -> None:
    request = {
        "messages": long_chat(client, 30),  # runs to 30 tokens without early stopping
        "max_new_tokens": 30,
        "early_stop": True,
        "policy": {"method": "msp", "threshold": 0.5},
    }
    body = client.post("/v1/generate", json=request).json()
    assert body["finish_reason"] == "uncertainty"
    assert 4 <= body["usage"]["completion_tokens"] < 30
    assert not body["decision"]["accept"] and body["uncertainty"]["msp"] > 0.5


def test_without_an_artifact_baselines_answer(service_settings: Settings, tmp_path) -> None:
    with make_client(service_settings, artifact_dir=tmp_path / "none") as client:
        body = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 4}).json()
        assert body["tad_available"] is False and body["artifact"] is None
        assert body["uncertainty"]["tad"] is None and math.isfinite(body["uncertainty"]["msp"])
        assert all(t["confidence"] is None for t in body["tokens"])
        assert body["decision"]["method"] == "perplexity" and body["decision"]["policy"] == "fallback:none"
        info = client.get("/info").json()
        assert info["tad_available"] is False and "no artifact" in info["tad_unavailable_reason"]
    with make_client(service_settings, artifact_dir=tmp_path / "none", fallback_threshold=0.0) as client:
        decision = client.post("/v1/generate", json={"messages": CHAT, "max_new_tokens": 4}).json()["decision"]
        assert decision["policy"] == "fallback:fixed" and decision["accept"] is False


def test_info_describes_model_artifact_and_policy(client: TestClient) -> None:
    info = client.get("/info").json()
    assert info["model"]["num_layers"] == 3 and info["device"] == "cpu"
    assert info["architecture"] == {"model_type": "llama", "tested": True, "note": None}
    assert info["artifact"]["features"]["n_lags"] == 4 and info["artifact"]["files"]
    assert info["policy"]["method"] == "tad" and info["policy"]["active"]
    # TAD_REJECT_TARGET "default": the artifact's, what a request naming another method is decided at
    assert info["policy"]["reject_target"] == info["artifact"]["default_target"] is not None
    assert info["limits"]["max_new_tokens"] == 32
    assert info["limits"]["prefill_chunk_tokens"] == Settings().prefill_chunk_tokens
    model_context = client.app.state.runtime.engine.loaded.model.config.max_position_embeddings
    assert info["limits"]["context_tokens"] == model_context  # the model's own: no compiled step's slot


def test_info_names_no_reject_target_when_none_is_configured(service_settings: Settings) -> None:
    with make_client(service_settings, reject_target=None) as client:
        assert client.get("/info").json()["policy"]["reject_target"] is None


def test_served_model_name(service_settings: Settings) -> None:
    with make_client(service_settings, served_model_name="tiny-llm") as client:
        assert client.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 1}).json()["model"] == "tiny-llm"
        assert client.get("/v1/models").json()["data"][0]["id"] == "tiny-llm"
        chat = {"model": "tiny-llm", "messages": CHAT, "max_tokens": 2}
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        assert client.post("/v1/chat/completions", json={**chat, "model": "model"}).status_code == 404


def test_score_refuses_overlong_answers_and_reads_special_tokens_as_text(client: TestClient) -> None:
    long = client.post("/v1/score", json={"prompt": "a", "response": "the " * 40})
    assert long.status_code == 422 and long.json()["error"]["param"] == "response"
    special = client.post("/v1/score", json={"prompt": "a", "response": "paris <|im_end|> london"}).json()
    ids = [t["id"] for t in special["tokens"]]
    assert 2 not in ids and len(ids) > 3  # <|im_end|> (id 2) is read as plain text, not as the stop token


def test_policy_method_override_uses_that_methods_threshold(service_settings: Settings) -> None:
    with make_client(service_settings, reject_method="tad", reject_threshold=0.5) as client:
        base = {"messages": CHAT, "max_new_tokens": 4}
        tad = client.post("/v1/generate", json=base).json()["decision"]
        assert tad["method"] == "tad" and tad["threshold"] == 0.5 and tad["policy"] == "fixed"
        msp = client.post("/v1/generate", json={**base, "policy": {"method": "msp"}}).json()["decision"]
        assert msp["method"] == "msp" and msp["threshold"] != 0.5


def test_explicit_tad_policy_without_artifact_is_refused(service_settings: Settings, tmp_path) -> None:
    with make_client(service_settings, artifact_dir=tmp_path / "none") as client:
        for policy in ({"method": "tad"}, {"threshold": 0.3}, {"target": "error@0.3"}):
            response = client.post("/v1/generate", json={"prompt": "a", "max_new_tokens": 2, "policy": policy})
            assert response.status_code == 422 and response.json()["error"]["param"] == "policy.method"
        fine = client.post(
            "/v1/generate", json={"prompt": "a", "max_new_tokens": 2, "policy": {"method": "msp", "threshold": 1.0}}
        )
        assert fine.json()["decision"]["policy"] == "fixed"


def test_chat_template_errors_are_bad_input(client: TestClient, monkeypatch) -> None:
    from jinja2 import TemplateError

    tokenizer = client.app.state.runtime.engine.loaded.tokenizer

    def refuse(*args, **kwargs):
        raise TemplateError("Conversation roles must alternate user/assistant")

    monkeypatch.setattr(tokenizer, "apply_chat_template", refuse)
    response = client.post("/v1/generate", json={"messages": CHAT})
    assert response.status_code == 422 and response.json()["error"]["param"] == "messages"


def test_chat_messages_to_a_base_model_are_a_clear_refusal(service_settings: Settings, tmp_path_factory) -> None:
    import shutil

    base = tmp_path_factory.mktemp("base") / "model"
    shutil.copytree(service_settings.model, base)
    (base / "chat_template.jinja").unlink(missing_ok=True)
    with make_client(service_settings, model=str(base), artifact_dir=tmp_path_factory.mktemp("none")) as client:
        for path, body in (
            ("/v1/generate", {"messages": CHAT, "max_new_tokens": 4}),
            ("/v1/chat/completions", {"model": client.get("/v1/models").json()["data"][0]["id"], "messages": CHAT}),
        ):
            response = client.post(path, json=body)
            assert response.status_code == invalid_status(path), path
            error = response.json()
            error = error["error"] if isinstance(error["error"], dict) else error  # the OpenAI routes nest it
            assert "no chat template" in (error.get("message") or error["error"]) and error["param"] == "messages"
        assert client.post("/v1/generate", json={"prompt": "what is", "max_new_tokens": 4}).status_code == 200


def test_a_one_token_answer_has_every_baseline(service_settings: Settings) -> None:
    """RAUQ and Attention Score read no attention for one token: finite even when its step is not run
    (the generating convention's engine; the answer was rejected for a null before)."""
    with make_client(service_settings) as client:
        engine = client.app.state.runtime.engine  # type: ignore[attr-defined]
        engine.context = dataclasses.replace(engine.context, last_row=False)
        body = client.post("/v1/generate", json={"prompt": "the capital of", "max_new_tokens": 1}).json()
    assert body["usage"]["completion_tokens"] == 1
    assert body["uncertainty"]["rauq"] is not None and body["uncertainty"]["attention_score"] == 0.0


def test_the_default_answer_length_gives_way_at_the_end_of_the_context(service_settings: Settings) -> None:
    """Near the end of the context (2,048 for the tiny model) a request that did not set max_new_tokens
    gets the room that is left; one that set it is refused naming it; a full prompt is the prompt's fault."""
    overrides = {"max_prompt_tokens": 4000, "default_max_new_tokens": 16, "max_new_tokens_limit": 32}
    with make_client(service_settings, **overrides) as client:
        one_word = client.post("/v1/generate", json={"prompt": "the", "max_new_tokens": 1}).json()
        two_words = client.post("/v1/generate", json={"prompt": "the the", "max_new_tokens": 1}).json()
        per_word = two_words["usage"]["prompt_tokens"] - one_word["usage"]["prompt_tokens"]
        assert per_word == 1  # so a prompt of any length can be built to the token
        fixed = one_word["usage"]["prompt_tokens"] - 1

        def prompt_of(tokens: int) -> str:
            return " ".join(["the"] * (tokens - fixed))

        near_end = {"prompt": prompt_of(2048 - 3), "temperature": 0}
        answered = client.post("/v1/generate", json=near_end)
        assert answered.status_code == 200, answered.text
        assert answered.json()["usage"]["prompt_tokens"] == 2045 and answered.json()["usage"]["completion_tokens"] <= 3
        refused = client.post("/v1/generate", json={**near_end, "max_new_tokens": 16})
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "max_new_tokens"
        full = client.post("/v1/generate", json={"prompt": prompt_of(2048)})
        assert full.status_code == 422 and full.json()["error"]["param"] == "prompt"
        assert "no room for an answer" in full.json()["error"]["message"]
        # /v1/completions' own default (16, OpenAI's) gives way the same; a max_tokens sent does not.
        completion = {"model": "model", "prompt": near_end["prompt"], "temperature": 0}
        answered = client.post("/v1/completions", json=completion)
        assert answered.status_code == 200, answered.text
        assert answered.json()["usage"]["completion_tokens"] <= 3
        refused = client.post("/v1/completions", json={**completion, "max_tokens": 16})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
