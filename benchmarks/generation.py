"""What continuous batching saves when `training generate` answers a shard of records.

For one shard of real training records (the first --per-dataset records after --skip of each
named dataset, with the prompts `generate` builds and its per-task answer limits), on the
default model with attention capture, it times, interleaved and repeated:

- static:      batches of --batch-size prompts, each run until its longest answer ends (how
               `generate` worked before);
- continuous:  at most --batch-size answers decoding at once, a finished answer's row
               refilled with the next prompt at once (`run_continuously`, what `generate` does).

Prints the median seconds of each, the tokens generated, how many answers came out token for token
the same both ways, and the ratio; the last line is `generation_speedup=<static / continuous,
the worst prompt style>`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from app.engine.engine import Engine
from app.engine.loading import load_model
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest, SequenceState
from app.settings import DEFAULT_MODEL
from training.data import read_records
from training.tasks import PromptStyle, build_prompt
from training.tasks import max_new_tokens as default_length

DATASETS = ("squad", "triviaqa", "mmlu", "nq_open", "gsm8k")


def shard_requests(
    engine: Engine, files: Sequence[Path], per_file: int, skip: int, style: PromptStyle
) -> list[GenerationRequest]:
    """The requests `generate` would make for these records, sorted by prompt length as it does."""
    requests = []
    for located in read_records(files, limit=per_file, bad=[], skip=skip):
        prompt = build_prompt(located.record, style, ())
        ids = engine.encode_prompt(prompt=prompt.text, messages=prompt.messages)
        limit = default_length(located.record.task, style)
        requests.append(GenerationRequest(tuple(ids), SamplingParams(max_new_tokens=limit, stop=prompt.stop)))
    return sorted(requests, key=lambda request: len(request.prompt_ids))


def static(engine: Engine, requests: Sequence[GenerationRequest], batch: int) -> list[SequenceState]:
    return [seq for start in range(0, len(requests), batch) for seq in engine.generate(requests[start : start + batch])]


def continuous(engine: Engine, requests: Sequence[GenerationRequest], batch: int) -> list[SequenceState]:
    finished = dict(engine.generate_continuously(requests, batch))
    return [finished[index] for index in range(len(requests))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--per-dataset", type=int, default=10, help="records of each dataset (one shard)")
    parser.add_argument("--skip", type=int, default=1200, help="past the records the default artifact trains on")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # As `generate` runs it: every step row kept, the last token's included.
    engine = Engine(load_model(DEFAULT_MODEL, device="cpu"), n_lags=10, last_row=True)
    files = [args.data / f"{name}_train.jsonl" for name in args.datasets]
    speedups = []
    print("| prompt style | answers | tokens | static s | continuous s | speed-up | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for style in (PromptStyle.TASK, PromptStyle.CHAT):
        requests = shard_requests(engine, files, args.per_dataset, args.skip, style)
        runs: dict[str, Callable[[Engine, Sequence[GenerationRequest], int], list[SequenceState]]] = {
            "static": static,
            "continuous": continuous,
        }
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        outputs: dict[str, list[SequenceState]] = {}
        for _ in range(args.repeats):
            for name, run in runs.items():
                started = time.perf_counter()
                outputs[name] = run(engine, requests, args.batch_size)
                seconds[name].append(time.perf_counter() - started)
        medians = {name: statistics.median(values) for name, values in seconds.items()}
        same = sum(
            engine.trace(a).token_ids == engine.trace(b).token_ids
            for a, b in zip(outputs["static"], outputs["continuous"], strict=True)
        )
        tokens = sum(len(seq.tokens) for seq in outputs["continuous"])
        speedup = medians["static"] / medians["continuous"]
        speedups.append(speedup)
        print(
            f"| {style.value} | {len(requests)} | {tokens} | {medians['static']:.1f} | {medians['continuous']:.1f} "
            f"| {speedup:.2f}x | {same}/{len(requests)} |",
            flush=True,
        )
    print(f"generation_speedup={min(speedups):.2f}")


if __name__ == "__main__":
    main()
