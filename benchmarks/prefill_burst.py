"""How soon each request of a burst gets its first token, whole prefill vs a prefill budget.

In one process, through the server's own scheduler: --requests prompts of --prompt-tokens tokens
arrive together at an idle server (queued under the scheduler's lock, so its worker admits them
all at once), each asking for --new-tokens greedy tokens. Per mode (`TAD_PREFILL_CHUNK_TOKENS` 0,
i.e. every prompt in one forward, and each --chunks value), interleaved over --repeats:

- first token, mean and p90: each request's time from the burst to its first token;
- done: the last answer's end.

With a budget, the prompts are prefilled in groups that fit in it, one group a step, each group
decoding as soon as it is prefilled (`prefill_groups` in `app/serving/work_items.py`). Prints
medians over repeats and each budget's ratio to the whole prefill measured in the same run. Last
line: `first_token_ratio=<mean first token with the first --chunks value / whole>`.

    python -m benchmarks.prefill_burst --model tiny-llama
    python -m benchmarks.prefill_burst --model smollm2-135m
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from dataclasses import dataclass

import torch

from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest, SequenceState
from app.serving.events import Event, Timing
from app.serving.scheduler import Scheduler
from app.serving.work_items import GenerationItem
from app.uncertainty.answer import AnswerScorer
from benchmarks.default_engine import add_model_arguments, load_capturing_engine

TINY = "tiny-llama"


class FirstTokenOnly:
    """Observer with nothing to do between steps: the scheduler stamps each item's first token."""

    needs_steps = False

    def on_step(self, sequence: SequenceState) -> list[Event]:
        return []

    def tad_pending(self, sequence: SequenceState) -> None:
        return None

    def on_finish(self, sequence: SequenceState, timing: Timing) -> list[Event]:
        return [("done", time.monotonic())]  # type: ignore[list-item]


@dataclass
class Measurement:
    mean_first_token_s: float
    p90_first_token_s: float
    done_s: float


def measure(
    engine: Engine, scorer: AnswerScorer, chunk_tokens: int, prompts: list[tuple[int, ...]], new_tokens: int
) -> Measurement:
    scheduler = Scheduler(
        engine,
        scorer,
        max_batch_size=len(prompts),
        max_queue=len(prompts),
        batch_window_s=0.0,
        prefill_chunk_tokens=chunk_tokens,
    )

    async def body() -> Measurement:
        loop = asyncio.get_running_loop()
        items = [
            GenerationItem(
                loop=loop,
                events=asyncio.Queue(),
                deadline=time.monotonic() + 600,
                request=GenerationRequest(prompt, SamplingParams(max_new_tokens=new_tokens)),
                observer=FirstTokenOnly(),
            )
            for prompt in prompts
        ]
        started = time.monotonic()
        with scheduler._condition:  # the worker admits the whole burst at its next pass
            for item in items:
                scheduler.submit_generation(item)
        ends = [(await item.events.get())[1] for item in items]  # type: ignore[index]
        first = sorted((item.first_token_at or math.inf) - started for item in items)  # every item has one
        return Measurement(statistics.mean(first), first[int(0.9 * (len(first) - 1))], max(ends) - started)

    scheduler.start()
    try:
        return asyncio.run(body())
    finally:
        scheduler.stop()


def tiny_engine() -> Engine:
    """The host-bound random model of `benchmarks/serving.py`, built on a thread that ends (see `in_own_thread`)."""
    from app.engine.attention_capture import register_capture_attention
    from benchmarks.random_models import build_model, id_tokenizer, make_engine
    from benchmarks.serving_server import in_own_thread, tiny_llama

    def build() -> Engine:
        torch.manual_seed(0)
        model = build_model(tiny_llama(), torch.float32, "cpu", register_capture_attention())
        return make_engine(model, id_tokenizer(model.config.vocab_size), TINY, 10)  # stop tokens off

    return in_own_thread(build)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--chunks", type=int, nargs="+", default=[512])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    if args.model == TINY:
        if args.threads:
            torch.set_num_threads(args.threads)
        engine, scorer, name = tiny_engine(), AnswerScorer(None), TINY
    else:
        loaded, artifact, engine = load_capturing_engine(args)
        scorer, name = AnswerScorer(artifact), loaded.identity.name
    vocabulary = engine.context.model.config.vocab_size
    rng = random.Random(0)
    prompts = [tuple(rng.randrange(2, vocabulary) for _ in range(args.prompt_tokens)) for _ in range(args.requests)]
    modes = [0, *args.chunks]
    for mode in modes:  # warm-up: every shape the modes run
        measure(engine, scorer, mode, prompts, 2)
    results: dict[int, list[Measurement]] = {mode: [] for mode in modes}
    for repeat in range(args.repeats):
        for mode in modes[repeat % len(modes) :] + modes[: repeat % len(modes)]:
            results[mode].append(measure(engine, scorer, mode, prompts, args.new_tokens))

    def median(mode: int, name: str) -> float:
        return statistics.median(getattr(m, name) for m in results[mode])

    print(
        f"model {name} on {engine.context.device}, {torch.get_num_threads()} threads; {args.requests} prompts of "
        f"{args.prompt_tokens} tokens at once, {args.new_tokens} new tokens each; medians of {args.repeats} repeats"
    )
    print(f"{'prefill':<18} {'first token mean s':>19} {'p90 s':>8} {'done s':>8} {'mean vs whole':>14}")
    for mode in modes:
        label = "whole (chunk 0)" if mode == 0 else f"groups of {mode}"
        mean = median(mode, "mean_first_token_s")
        print(
            f"{label:<18} {mean:>19.4f} {median(mode, 'p90_first_token_s'):>8.4f} {median(mode, 'done_s'):>8.3f} "
            f"{mean / median(0, 'mean_first_token_s'):>13.2f}x"
        )
    print(f"first_token_ratio={median(args.chunks[0], 'mean_first_token_s') / median(0, 'mean_first_token_s'):.3f}")


if __name__ == "__main__":
    main()
