"""What one admission costs the worker, eager prefill against the compiled one, with and without a busy thread.

Tiny host-bound model of `benchmarks.serving` (random 4-layer Llama), decode step compiled for 32
slots of 288 tokens (`TAD_COMPILED_DECODE_LENGTH=288`), one 128-token prompt per admission: its
prefill (`Engine.start_prefill(...).advance()`) and its copy into a free slot (`merge`), then the
slot freed again. Eager (`PromptPrefill`) and compiled (`CompiledPromptPrefill`) alternate over
--rounds rounds; the median of each round's mean is printed. Then the same with another Python
thread spinning (as the server's event loop does while it serves HTTP): compiled code gives the GIL
up while it runs and has to take it back.

    python -m benchmarks.compiled_prefill
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from collections.abc import Callable

import torch

from app.engine.attention_capture import register_capture_attention
from app.engine.decoding import PromptPrefill
from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from benchmarks.gpu_overhead import build_model, id_tokenizer, make_engine
from benchmarks.serving_server import tiny_llama


def mean_ms(action: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        action()
    return (time.perf_counter() - started) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(2)
    config = tiny_llama()
    model = build_model(config, torch.float32, "cpu", register_capture_attention())
    loaded = make_engine(model, id_tokenizer(config.vocab_size), "tiny-llama", 8).loaded
    engine = Engine(loaded, n_lags=8, compiled_decode_length=288)
    seconds = engine.warm_up_compiled_decode(32)
    assert seconds is not None, engine.compiled_decode_refusal()
    print(f"decode step and prefill compiled in {seconds:.1f} s")
    batch = engine.running_batch(32)
    assert batch is not None
    rng = random.Random(0)
    prompt = tuple(rng.randrange(2, config.vocab_size) for _ in range(args.prompt_tokens))
    request = GenerationRequest(prompt, SamplingParams(max_new_tokens=4))

    def admit(compiled: bool) -> None:
        job = engine.start_prefill([request]) if compiled else PromptPrefill(engine.context, [request])
        joined = job.advance()
        assert joined is not None
        batch.merge(joined)
        batch._select([])

    stop = threading.Event()

    def spin() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    for busy in (False, True):
        spinner = threading.Thread(target=spin, daemon=True)
        if busy:
            spinner.start()
        times: dict[str, list[float]] = {"eager": [], "compiled": []}
        for _ in range(args.rounds):
            for name in times:
                times[name].append(mean_ms(lambda name=name: admit(name == "compiled"), args.calls))  # type: ignore[misc]
        if busy:
            stop.set()
        label = "another thread running Python" if busy else "alone"
        eager, compiled = statistics.median(times["eager"]), statistics.median(times["compiled"])
        print(f"{label}: admission {eager:.2f} ms eager, {compiled:.2f} ms compiled ({eager / compiled:.2f}x)")


if __name__ == "__main__":
    main()
