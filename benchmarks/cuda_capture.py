"""The capture path on a GPU: correctness against eager attention, and its cost at real model size.

Weights cannot travel to a GPU machine, so both parts use randomly initialised models:
- `--check`: the tiny test model (tests/fixtures) loaded through the engine on CUDA in float32
  and bfloat16; every captured step row (keys 0..N back) against eager `output_attentions`
  of one full forward over prompt + answer; prints the largest difference per dtype.
- `--time`: a random bf16 model from a real config (Llama-3.1-8B, Qwen2.5-7B shapes); plain
  `generate` (sdpa, greedy, exactly `--new-tokens`) against this engine with capture
  (N = 10, generating convention) at several batch sizes and prompt lengths; tokens/s, peak
  GPU memory and the ratio, median of `--repeats` runs in alternating order. Last line: the
  worst ratio.

    python -m benchmarks.cuda_capture --check --time --models llama
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config

from app.engine.attention_capture import register_capture_attention
from app.engine.engine import Engine
from app.engine.loading import LoadedModel, load_model
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.identity import ModelIdentity

CONFIGS = {
    "llama": lambda: LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        tie_word_embeddings=False,
    ),
    "qwen": lambda: Qwen2Config(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    ),
}


def check(n_lags: int = 4) -> None:
    from tests.fixtures.tiny_model import write_tiny_model

    folder = write_tiny_model(Path(tempfile.mkdtemp()) / "tiny")
    for dtype in ("float32", "bfloat16"):
        loaded = load_model(str(folder), device="cuda", dtype=dtype)
        engine = Engine(loaded, n_lags=n_lags)
        eager = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype), attn_implementation="eager")
        eager = eager.to("cuda").eval()
        prompts = [
            engine.encode_prompt(messages=[{"role": "user", "content": text}])
            for text in ("what is the capital of france ?", "who", "name the largest river in africa and europe")
        ]
        sequences = engine.generate([GenerationRequest(tuple(p), SamplingParams(max_new_tokens=9)) for p in prompts])
        worst = 0.0
        for prompt, sequence in zip(prompts, sequences, strict=True):
            answer = [t.token_id for t in sequence.tokens]
            with torch.no_grad():
                attentions = eager(torch.tensor([prompt + answer], device="cuda"), output_attentions=True).attentions
            for j, row in enumerate(sequence.attention_rows):
                query = len(prompt) + j
                for back in range(0, min(n_lags, j) + 1):  # only generated tokens are keys
                    for layer, attention in enumerate(attentions):
                        expected = attention[0, :, query, query - back].float().cpu().numpy()
                        worst = max(worst, float(abs(row[layer, :, back] - expected).max()))
        print(f"check {dtype}: captured rows vs eager, max |difference| = {worst:.2e}")


def wide_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    vocab = {f"t{i}": i for i in range(vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="t0", eos_token="t1", pad_token="t1")


def timed(run: object) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    run()  # type: ignore[operator]
    torch.cuda.synchronize()
    return time.perf_counter() - started


def time_model(name: str, batches: list[int], prompts: list[int], new_tokens: int, repeats: int) -> float:
    config = CONFIGS[name]()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation=register_capture_attention()
        ).eval()
    model.generation_config.eos_token_id = None
    tokenizer = wide_tokenizer(config.vocab_size)
    identity = ModelIdentity(
        name=name,
        source="random",
        sha256="random",
        num_layers=config.num_hidden_layers,
        num_heads=config.num_attention_heads,
        vocab_size=config.vocab_size,
    )
    engine = Engine(LoadedModel(model, tokenizer, identity, torch.device("cuda")), n_lags=10, last_row=False)
    engine.context = replace(engine.context, stop_token_ids=frozenset())  # always exactly new_tokens
    bare_engine = engine.with_lags(0)  # the same decode loop without capture: what capture alone adds
    print(f"\n{name} ({torch.cuda.get_device_name()}), bf16, {new_tokens} new tokens, median of {repeats}")
    print(
        "| batch | prompt | plain s | plain tok/s | engine s | capture s | capture tok/s | vs plain | vs engine "
        "| plain GB | capture GB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    generator = torch.Generator().manual_seed(0)
    for length in prompts:
        for batch in batches:
            ids = torch.randint(2, config.vocab_size, (batch, length), generator=generator)
            requests = [
                GenerationRequest(tuple(row.tolist()), SamplingParams(max_new_tokens=new_tokens)) for row in ids
            ]
            inputs = ids.to("cuda")

            def plain(inputs: torch.Tensor = inputs) -> None:
                with torch.inference_mode():
                    model.generate(
                        inputs,
                        attention_mask=torch.ones_like(inputs),
                        max_new_tokens=new_tokens,
                        min_new_tokens=new_tokens,
                        do_sample=False,
                        pad_token_id=1,
                    )

            def capture(requests: list[GenerationRequest] = requests) -> None:
                engine.generate(requests)

            def bare(requests: list[GenerationRequest] = requests) -> None:
                bare_engine.generate(requests)

            memory = {}
            for label, run in (("plain", plain), ("capture", capture), ("engine", bare)):
                torch.cuda.reset_peak_memory_stats()
                run()  # warm-up, and the peak memory of one run
                memory[label] = torch.cuda.max_memory_allocated() / 2**30
            times: dict[str, list[float]] = {"plain": [], "capture": [], "engine": []}
            for repeat in range(repeats):
                order = [("plain", plain), ("capture", capture), ("engine", bare)]
                for label, run in order[repeat % 3 :] + order[: repeat % 3]:
                    times[label].append(timed(run))
            plain_s, capture_s = statistics.median(times["plain"]), statistics.median(times["capture"])
            engine_s = statistics.median(times["engine"])
            ratio = capture_s / plain_s
            worst = max(worst, ratio)
            tokens = batch * new_tokens
            print(
                f"| {batch} | {length} | {plain_s:.2f} | {tokens / plain_s:.0f} | {engine_s:.2f} | {capture_s:.2f} | "
                f"{tokens / capture_s:.0f} | {ratio:.3f} | {capture_s / engine_s:.3f} | {memory['plain']:.1f} | "
                f"{memory['capture']:.1f} |",
                flush=True,
            )
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--models", nargs="+", choices=sorted(CONFIGS), default=["llama"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompts", type=int, nargs="+", default=[128, 2048])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.check:
        check()
    if args.time:
        worst = 0.0
        for name in args.models:
            worst = max(worst, time_model(name, args.batches, args.prompts, args.new_tokens, args.repeats))
            torch.cuda.empty_cache()
        print(f"\nworst_ratio={worst:.3f}")


if __name__ == "__main__":
    main()
