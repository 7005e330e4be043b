"""Decode speed of a model in float32 and in bfloat16, at batch 1 and 8 (`dtype=auto`'s choice, measured).

Plain transformers `generate` (sdpa attention, greedy, exactly --new-tokens new tokens after a short
chat prompt), the two dtypes interleaved within each repeat so that machine noise hits both alike.
Prints the median decode tokens/s of each (generated tokens x batch over the whole call's seconds)
and the bfloat16 / float32 ratio per batch; the last line is `bf16_speedup=<the ratio at the largest
batch>`. On a CPU without native bfloat16 (see `cpu_computes_bf16`) the ratio is below 1: that is why
`auto` picks float32 there.

`--products`: one linear layer of the default model's MLP shape (1536 x 8960) at 1 to 512 rows instead,
in bfloat16 (the kernel torch picks here), float32, and bfloat16 widened as a CPU without fast bfloat16
kernels runs it (`app/engine/cpu_bf16.py`; where `MIN_ROWS` comes from), ms per product, median of
`--repeats`.

    python -m benchmarks.dtype_speed --model qwen2.5-coder-1.5b
    python -m benchmarks.dtype_speed --products --repeats 5
    python -m benchmarks.dtype_speed --model smollm2-135m --batches 1 8 --repeats 5
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from app.engine.cpu_bf16 import widen_bf16_products
from app.engine.loading import LoadedModel, cpu_computes_bf16, load_model
from app.settings import DEFAULT_CACHE_DIR, DEFAULT_MODEL

DTYPES = ("float32", "bfloat16")
PROMPT = [{"role": "user", "content": "Write a short story about a cat who learns to sail."}]


def time_generate(loaded: LoadedModel, batch: int, new_tokens: int) -> float:
    """Seconds of one greedy `generate` call of `batch` copies of the prompt, exactly `new_tokens` long."""
    tokenizer = loaded.tokenizer
    encoded: Any = tokenizer.apply_chat_template(
        PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    input_ids = encoded["input_ids"].repeat(batch, 1).to(loaded.device)
    started = time.perf_counter()
    with torch.inference_mode():
        loaded.model.generate(  # type: ignore[operator]  # torch types module attributes as tensors
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    return time.perf_counter() - started


def time_products(repeats: int) -> None:
    """ms per product of a 1536 x 8960 bfloat16 layer, three ways, at 1 to 512 rows."""
    layer = torch.nn.Linear(1536, 8960, bias=False, dtype=torch.bfloat16).requires_grad_(False)
    weight, wide_weight = layer.weight, layer.weight.float()
    widen_bf16_products(layer)
    print(f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    print("| rows | bfloat16 ms | float32 ms | widened ms |")
    print("|---|---|---|---|")
    for rows in (1, 8, 32, 48, 64, 128, 512):
        x = torch.randn(rows, 1536).bfloat16()
        runs = {
            "bfloat16": lambda x=x: torch.nn.functional.linear(x, weight),
            "float32": lambda x=x: torch.nn.functional.linear(x.float(), wide_weight),
            "widened": lambda x=x: layer(x),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(repeats + 1):  # the first round warms up
            for name, run in runs.items():
                started = time.perf_counter()
                run()
                times[name].append(1000 * (time.perf_counter() - started))
        print(f"| {rows} | " + " | ".join(f"{statistics.median(t[1:]):.1f}" for t in times.values()) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="a model spec or catalog name")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    parser.add_argument("--products", action="store_true", help="time one layer's product instead")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.products:
        time_products(args.repeats)
        return
    seconds: dict[tuple[str, int], list[float]] = {(d, b): [] for d in DTYPES for b in args.batches}
    name = args.model
    # One model in memory at a time (a 1.5B model is 6 GB in float32): each repeat loads each dtype in turn.
    for _ in range(args.repeats):
        for dtype in DTYPES:
            loaded = load_model(args.model, device="cpu", dtype=dtype, cache_dir=args.cache_dir)
            name = loaded.identity.name
            time_generate(loaded, 1, 4)  # warm-up: first-call allocations and kernel selection
            for batch in args.batches:
                seconds[dtype, batch].append(time_generate(loaded, batch, args.new_tokens))
            del loaded
            gc.collect()
    print(
        f"model {name}, {torch.get_num_threads()} threads, {args.new_tokens} new tokens, median of "
        f"{args.repeats}; CPU computes bf16 natively: {cpu_computes_bf16()}"
    )
    print("| batch | float32 tokens/s | bfloat16 tokens/s | bf16 / f32 |")
    print("|---|---|---|---|")
    ratio = float("nan")
    for batch in args.batches:
        rates = {d: batch * args.new_tokens / statistics.median(seconds[d, batch]) for d in DTYPES}
        ratio = rates["bfloat16"] / rates["float32"]
        print(f"| {batch} | {rates['float32']:.1f} | {rates['bfloat16']:.1f} | {ratio:.2f} |")
    print(f"bf16_speedup={ratio:.2f}")


if __name__ == "__main__":
    main()
