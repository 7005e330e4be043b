"""The real default model (Qwen2.5-Coder-1.5B-Instruct, joined from its 22 PyPI packages) with its artifact,
end to end in bfloat16. Slow: about two minutes (joining, dequantising once, one short answer)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from app.engine.loading import load_model, resolve_source
from app.engine.prefix_text import PrefixText
from app.settings import DEFAULT_ARTIFACT, DEFAULT_MODEL, Settings
from tests.app.service_client import make_client, wait_ready

pytestmark = pytest.mark.slow

GGUF_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


@pytest.fixture(scope="module", autouse=True)
def _torch_threads_restored() -> Iterator[None]:
    """These tests run the 1.5B model on 2 threads; the tests after them keep conftest's 1 (tests/conftest.py)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf-cache")


def test_default_model_is_joined_from_its_packages_into_the_cache(cache_dir: Path) -> None:
    source = resolve_source(DEFAULT_MODEL, cache_dir=cache_dir)  # joins the 22 parts, checks size and sha256
    assert source.kind == "gguf" and source.gguf_file == GGUF_FILE
    assert Path(source.location).is_relative_to(cache_dir / "assembled")
    assert (Path(source.location) / GGUF_FILE).stat().st_size == 1_117_320_768


def test_its_answers_text_decoded_a_few_tokens_at_a_time_is_the_text_decoded_whole(cache_dir: Path) -> None:
    """`PrefixText` on the real tokenizer, as the stream and the stop-string search ask it: each prefix of an
    answer and the one before it, for real text (a character split over byte-level tokens included) and for
    random ids, which split characters anywhere."""
    source = resolve_source(DEFAULT_MODEL, cache_dir=cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file)

    def decode(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=True))

    text = "东京是日本的首都。 Paris, café crème 🙂👍 — it isn't ; right ?\n\tdef f(x):\n    return x ** 2\n" * 8
    rng = random.Random(0)
    answers = [tokenizer(text, add_special_tokens=False)["input_ids"]]
    answers += [[rng.randrange(len(tokenizer)) for _ in range(200)] for _ in range(4)]
    for answer in answers:
        growing = PrefixText(decode)
        for n in range(1, len(answer) + 1):
            assert growing(answer[:n]) == decode(answer[:n])
            assert growing(answer[: n - 1]) == decode(answer[: n - 1])


def test_the_bfloat16_copy_is_written_once_and_reloads_to_identical_logits(cache_dir: Path) -> None:
    torch.set_num_threads(2)
    first = load_model(DEFAULT_MODEL, cache_dir=cache_dir, dtype="bfloat16")  # dequantises, writes the copy
    (copy,) = [p for p in cache_dir.iterdir() if p.name.startswith("gguf-") and p.name.endswith("-bfloat16")]
    written = {p.name: p.stat().st_mtime_ns for p in copy.iterdir()}
    second = load_model(DEFAULT_MODEL, cache_dir=cache_dir, dtype="bfloat16")
    assert {p.name: p.stat().st_mtime_ns for p in copy.iterdir()} == written  # read, not rewritten
    assert first.model.dtype == second.model.dtype == torch.bfloat16
    ids = torch.tensor([first.tokenizer("The capital of France is")["input_ids"]])
    with torch.inference_mode():
        assert torch.equal(first.model(ids).logits, second.model(ids).logits)
    assert first.identity == second.identity
    assert (first.identity.num_layers, first.identity.num_heads) == (28, 12)


def test_factual_question_end_to_end_with_the_default_artifact(cache_dir: Path) -> None:
    # dtype auto (the tests' environment pins float32 for the tiny models): the artifact's bfloat16.
    settings = Settings(cache_dir=cache_dir, torch_threads=2, dtype="auto")
    assert settings.artifact_dir == DEFAULT_ARTIFACT
    with make_client(settings, ready=False) as client:
        wait_ready(client, timeout=300)  # run alone, this test dequantises the model first
        info = client.get("/info").json()
        assert info["dtype"] == "bfloat16" and info["tad_available"]
        messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
        body = client.post("/v1/generate", json={"messages": messages, "max_new_tokens": 16}).json()
    assert "paris" in body["text"].lower()
    assert body["model"] == "qwen2.5-coder-1.5b-instruct-q4_k_m"
    assert body["artifact"] == DEFAULT_ARTIFACT.name and body["tad_available"]
    assert body["tokens"] and all(math.isfinite(t["logprob"]) and 0 < t["confidence"] <= 1 for t in body["tokens"])
    scores = body["uncertainty"]
    for method in ("tad", "msp", "perplexity", "mean_token_entropy", "max_token_uncertainty", "rauq"):
        assert math.isfinite(scores[method])
    decision = body["decision"]
    assert decision["method"] == "tad" and decision["policy"].startswith("calibrated:")
    assert decision["accept"] == (decision["score"] <= decision["threshold"])
