"""How long a long prompt joining the server's batch pauses an answer already streaming, whole vs chunked.

In one process, on the default model, through the server's own scheduler: an answer (a short
chat prompt, --new-tokens greedy tokens) streams; once it has --join-after tokens, a request
with a --long-tokens prompt joins. Every token of the running answer is timestamped as the
scheduler hands it over. Per mode (`TAD_PREFILL_CHUNK_TOKENS` 0, i.e. the prompt in one
forward, and each --chunks value), interleaved over --repeats:

- longest gap: the running answer's longest wait between two tokens (the stall the join causes);
- median gap: its usual time per token;
- joiner first token: the joining request's time from submission to its first token (what
  chunking costs it);
- total: both answers done.

Prints medians over repeats and each chunked mode's ratios to the whole prefill measured in
the same run. Last line: `stall_ratio=<longest gap with the first --chunks value / whole>`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass, field

import torch

from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest, SequenceState
from app.serving.events import Event, Timing
from app.serving.scheduler import Scheduler
from app.serving.work_items import GenerationItem
from app.uncertainty.answer import AnswerScorer
from benchmarks.default_engine import add_model_arguments, load_capturing_engine, long_prompt


@dataclass
class TokenClock:
    """Observer: when each new token of one sequence was handed over."""

    times: list[float] = field(default_factory=list)
    seen: int = 0

    def on_step(self, sequence: SequenceState) -> list[Event]:
        now = time.perf_counter()
        while self.seen < len(sequence.tokens):
            self.times.append(now)
            self.seen += 1
        return []

    def tad_pending(self, sequence: SequenceState) -> None:
        return None  # no TAD stream to prime

    def on_finish(self, sequence: SequenceState, timing: Timing) -> list[Event]:
        self.on_step(sequence)
        return [("done", time.perf_counter())]  # type: ignore[list-item]


@dataclass
class Measurement:
    longest_gap_s: float
    median_gap_s: float
    joiner_first_token_s: float
    total_s: float


def measure(
    engine: Engine, scorer: AnswerScorer, chunk_tokens: int, short: list[int], long: list[int], args: argparse.Namespace
) -> Measurement:
    scheduler = Scheduler(
        engine, scorer, max_batch_size=2, max_queue=2, batch_window_s=0.0, prefill_chunk_tokens=chunk_tokens
    )

    def item(loop: asyncio.AbstractEventLoop, prompt: list[int], new: int, clock: TokenClock) -> GenerationItem:
        return GenerationItem(
            loop=loop,
            events=asyncio.Queue(),
            deadline=time.monotonic() + 600,
            request=GenerationRequest(tuple(prompt), SamplingParams(max_new_tokens=new)),
            observer=clock,
        )

    running_clock, joining_clock = TokenClock(), TokenClock()

    async def body() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        running = item(loop, short, args.new_tokens, running_clock)
        scheduler.submit_generation(running)
        while running_clock.seen < args.join_after:
            await asyncio.sleep(0.001)
        joined_at = time.perf_counter()
        scheduler.submit_generation(item(loop, long, 4, joining_clock))
        await running.events.get()
        while not joining_clock.times:
            await asyncio.sleep(0.001)
        return started, joined_at

    scheduler.start()
    try:
        started, joined_at = asyncio.run(body())
        while scheduler.unanswered:
            time.sleep(0.001)
    finally:
        scheduler.stop()
    if len(running_clock.times) != args.new_tokens:
        raise SystemExit(f"the running answer stopped after {len(running_clock.times)} tokens")
    gaps = [b - a for a, b in zip(running_clock.times, running_clock.times[1:], strict=False)]
    return Measurement(
        longest_gap_s=max(gaps),
        median_gap_s=statistics.median(gaps),
        joiner_first_token_s=joining_clock.times[0] - joined_at,
        total_s=max(running_clock.times[-1], joining_clock.times[-1]) - started,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--long-tokens", type=int, default=2048)
    parser.add_argument("--chunks", type=int, nargs="+", default=[512, 256])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--join-after", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    # Stop tokens off: the running answer is exactly --new-tokens long in every mode.
    loaded, artifact, engine = load_capturing_engine(args)
    scorer = AnswerScorer(artifact)
    short = engine.encode_prompt(messages=[{"role": "user", "content": "Write a short story about a cat."}])
    long = long_prompt(engine, args.long_tokens)
    modes = [0, *args.chunks]
    measure(engine, scorer, 0, short, long[:256], args)  # warm-up
    results: dict[int, list[Measurement]] = {mode: [] for mode in modes}
    for repeat in range(args.repeats):
        for mode in modes[repeat % len(modes) :] + modes[: repeat % len(modes)]:
            results[mode].append(measure(engine, scorer, mode, short, long, args))

    def median(mode: int, name: str) -> float:
        return statistics.median(getattr(m, name) for m in results[mode])

    print(
        f"model {loaded.identity.name} on {loaded.device}, {torch.get_num_threads()} threads; a {len(long)}-token "
        f"prompt joins an answer streaming {args.new_tokens} tokens after its {args.join_after}th; "
        f"medians of {args.repeats} repeats"
    )
    header = f"{'prefill':<18} {'longest gap s':>14} {'median gap s':>13} {'joiner 1st token s':>19} {'total s':>8}"
    print(header + f" {'gap vs whole':>13} {'1st token vs whole':>19}")
    for mode in modes:
        label = "whole (chunk 0)" if mode == 0 else f"chunks of {mode}"
        gap, first = median(mode, "longest_gap_s"), median(mode, "joiner_first_token_s")
        print(
            f"{label:<18} {gap:>14.3f} {median(mode, 'median_gap_s'):>13.3f} {first:>19.3f} "
            f"{median(mode, 'total_s'):>8.2f} {gap / median(0, 'longest_gap_s'):>12.2f}x "
            f"{first / median(0, 'joiner_first_token_s'):>18.2f}x"
        )
    print(f"stall_ratio={median(args.chunks[0], 'longest_gap_s') / median(0, 'longest_gap_s'):.3f}")


if __name__ == "__main__":
    main()
