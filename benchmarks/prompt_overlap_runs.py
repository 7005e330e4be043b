"""Copies of generation runs with one more per-token statistic, `prompt_overlap`, to measure it as a TAD feature.

A token's `prompt_overlap` is 1 when its text, stripped of surrounding whitespace and case-folded, is
the text of some token of its own prompt (the chat prompt exactly as `generate` encoded it), else 0:
does the answer take this piece from its prompt? It is the per-token form of the novel-word share
(`benchmarks/prompt_copy.py`) and is known the moment the token is sampled, as a streamed confidence
needs. The copies link every file of the original shards (nothing is duplicated) and add
`stat-prompt_overlap.npy`, so that

    python -m training fit COPIES... --extra-feature-sets prompt_overlap     (cross-validated ablation)
    python -m training lodo COPIES... --test COPIES... --artifact A --extra-stats prompt_overlap

measure it. It was measured this way and not adopted (README, "How much the answer copies from its
prompt"), so serving does not record it. The prompt's pieces include its chat template's (role
names, and the empty piece of its line breaks), so an answer token that is only whitespace, or
such a word, counts as copied: the measurement was made so. Resumable shard by shard:

    python -m benchmarks.prompt_overlap_runs --out runs/overlap RUN...
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerBase

from app.engine.chat_prompt import encode_chat
from app.engine.loading import load_model
from benchmarks.run_copies import chat_run_settings, pending_shards, run_records, runs_model, write_linked_shard
from training.data import QARecord
from training.runs import RUN_FILE, STAT_PREFIX
from training.tasks import PromptStyle, build_messages

PROMPT_OVERLAP = "prompt_overlap"


class TokenPieces:
    """Each token's text as the overlap compares it (stripped, case-folded), decoded once per token id."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self._pieces: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = str(self.tokenizer.decode([token_id])).strip().casefold()
        return piece


def prompt_overlap(
    answer_ids: Sequence[int] | np.ndarray, prompt_ids: Sequence[int], pieces: TokenPieces
) -> np.ndarray:
    """1.0 for each answer token whose piece is among the prompt tokens' pieces, else 0.0 (float64, a statistic)."""
    in_prompt = {pieces(int(token)) for token in prompt_ids}
    return np.array([1.0 if pieces(int(token)) in in_prompt else 0.0 for token in answer_ids], dtype=np.float64)


def annotate_run(run: Path, out: Path, pieces: TokenPieces, tokenizer: PreTrainedTokenizerBase) -> int:
    """Write `out/<run name>` (a linked copy with `prompt_overlap`); returns the shards written now."""
    settings = chat_run_settings(run)
    target = out / run.name
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run / RUN_FILE, target / RUN_FILE)
    records: dict[str, QARecord] | None = None
    written = 0
    for shard, final in pending_shards(run, target, "prompt overlap"):
        records = records if records is not None else run_records(run, settings)
        metas = json.loads((shard / "texts.json").read_text())
        offsets, token_ids = np.load(shard / "offsets.npy"), np.load(shard / "token_ids.npy")
        overlap = np.zeros(len(token_ids), dtype=np.float64)
        for index, meta in enumerate(metas):
            record = records.get(meta["key"])
            if record is None:
                raise SystemExit(f"{shard}: answer {meta['key']} has no record in the run's data files")
            style = PromptStyle(meta.get("prompt_style", PromptStyle.TASK.value))
            start, end = int(offsets[index]), int(offsets[index + 1])
            prompt_ids = encode_chat(tokenizer, build_messages(record, style))
            overlap[start:end] = prompt_overlap(token_ids[start:end], prompt_ids, pieces)
        write_linked_shard(shard, final, {f"{STAT_PREFIX}{PROMPT_OVERLAP}.npy": overlap})
        written += 1
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="generation runs (chat or task prompts)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the copies (one per run, same name)")
    args = parser.parse_args(argv)
    tokenizer = load_model(runs_model(args.runs), device="cpu", verify_sha256=False).tokenizer
    pieces = TokenPieces(tokenizer)
    for run in args.runs:
        annotate_run(run, args.out, pieces, tokenizer)
        print(f"{args.out / run.name}")


if __name__ == "__main__":
    main()
