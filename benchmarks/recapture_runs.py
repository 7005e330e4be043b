"""Copies of generation runs with their attention rows captured again by teacher forcing, with more lags.

A run stores step rows for the lags it was generated with (10 for the default runs), so TAD can
be fitted with at most that many. Teacher forcing runs each stored answer through the model once
more (one forward per batch of answers instead of one per token) with the capture set to
`--lags`, and the copy holds those rows in place of the stored ones, every other file linked, so

    python -m training fit COPIES... --n-lags 20 ...

measures more lags without generating again. Per shard it prints the largest difference between
the new rows and the stored ones on the slots both have: a check that teacher forcing reproduces
the generation (float rounding only). Resumable shard by shard:

    python -m benchmarks.recapture_runs --lags 20 --out runs/lags20 RUN...
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from app.engine.engine import Engine
from app.engine.loading import load_model
from benchmarks.run_copies import chat_run_settings, pending_shards, run_records, runs_model, write_linked_shard
from training.data import QARecord
from training.runs import RUN_FILE
from training.tasks import PromptStyle, build_messages

BATCH = 8  # answers per teacher-forced forward, sorted by length so that little is padding


def shard_rows(engine: Engine, shard: Path, records: Mapping[str, QARecord]) -> tuple[np.ndarray, float]:
    """The shard's step rows `[tokens, layers, heads, lags + 1]` by teacher forcing, and the largest
    difference from the stored rows on the slots both hold."""
    metas = json.loads((shard / "texts.json").read_text())
    offsets, token_ids = np.load(shard / "offsets.npy"), np.load(shard / "token_ids.npy")
    stored = np.load(shard / "attention.npy", mmap_mode="r")
    layers, heads = engine.identity.num_layers, engine.identity.num_heads
    rows = np.zeros((len(token_ids), layers, heads, engine.n_lags + 1), dtype=np.float32)
    answers = []
    for index, meta in enumerate(metas):
        if meta["key"] not in records:
            raise SystemExit(f"{shard}: answer {meta['key']} has no record in the run's data files")
        style = PromptStyle(meta.get("prompt_style", PromptStyle.TASK.value))
        prompt = engine.encode_prompt(messages=build_messages(records[meta["key"]], style))
        start, end = int(offsets[index]), int(offsets[index + 1])
        if end > start:
            answers.append((start, end, prompt, [int(token) for token in token_ids[start:end]]))
    answers.sort(key=lambda answer: len(answer[2]) + len(answer[3]))
    for first in range(0, len(answers), BATCH):
        batch = answers[first : first + BATCH]
        for (start, end, _, _), trace in zip(batch, engine.score([(a[2], a[3]) for a in batch]), strict=True):
            assert trace.attention is not None  # the engine captures: n_lags >= 1
            rows[start:end] = trace.attention
    shared = min(stored.shape[-1], rows.shape[-1]) if len(stored) else 0
    difference = float(np.abs(rows[..., :shared] - stored[..., :shared]).max()) if shared else 0.0
    return rows, difference


def recapture_run(run: Path, out: Path, engine: Engine) -> list[float]:
    """Write `out/<run name>` with rows of `engine.n_lags` lags; the per-shard differences of the shards written now."""
    settings = chat_run_settings(run)
    target = out / run.name
    target.mkdir(parents=True, exist_ok=True)
    (target / RUN_FILE).write_text(json.dumps({**settings, "n_lags": engine.n_lags}, indent=2) + "\n")
    records: dict[str, QARecord] | None = None
    differences = []
    for shard, final in pending_shards(run, target, "recapture"):
        records = records if records is not None else run_records(run, settings)
        rows, difference = shard_rows(engine, shard, records)
        write_linked_shard(shard, final, {"attention.npy": rows})
        differences.append(difference)
    return differences


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="generation runs (chat or task prompts)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the copies (one per run, same name)")
    parser.add_argument("--lags", type=int, required=True, help="lags to capture (keys 0..lags back)")
    args = parser.parse_args(argv)
    if args.lags < 1:
        raise SystemExit("--lags must be at least 1")
    engine = Engine(load_model(runs_model(args.runs), device="cpu"), n_lags=args.lags)
    for run in args.runs:
        differences = recapture_run(run, args.out, engine)
        largest = max(differences, default=0.0)
        print(f"{args.out / run.name}: {len(differences)} shards, stored rows reproduced within {largest:.1e}")


if __name__ == "__main__":
    main()
