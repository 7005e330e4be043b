"""`python -m training generate`: answer records with the LLM and store per-token features (training/generation.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from training.arguments import RESUMES, add_generation_options, check_report_folder, int_at_least, prompt_style
from training.tasks import PromptStyle

NAME = "generate"
INTERRUPTED = RESUMES


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        help="answer records with the LLM and store per-token features (resumable)",
        description="Generate greedily for every record, store probabilities, entropies, attention rows "
        "and targets in shards under --out. Rerunning the same command resumes. Under "
        "`accelerate launch` every process takes its share of shards.",
    )
    parser.add_argument("--data", type=Path, nargs="+", required=True, help="JSONL files")
    parser.add_argument("--out", type=Path, required=True, help="run folder")
    parser.add_argument("--n-lags", type=int_at_least(1), default=10, help="attention lags N to store")
    parser.add_argument("--shard-size", type=int_at_least(1), default=64, help="records per shard")
    parser.add_argument(
        "--skip",
        type=int_at_least(0),
        default=0,
        help="valid records per file to pass over first: a second run with --skip N extends one made with "
        "--limit N by disjoint records",
    )
    parser.add_argument("--max-prompt-tokens", type=int_at_least(1), default=2048)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--prompt-style",
        type=prompt_style,
        choices=tuple(PromptStyle),
        default=PromptStyle.TASK,
        help="task: the task's instruction (short answers); chat (formerly bare, still accepted): the question "
        "alone, as users ask (64 tokens, more where the task's own budget is longer); few-shot: k worked "
        "examples from each data file's <dataset>_train.jsonl beside it, then the question (base models, no "
        "chat template)",
    )
    add_generation_options(parser)
    return parser


def run(args: argparse.Namespace) -> None:
    from app.settings import DEFAULT_MODEL
    from training.generation import GenerateOptions, run_generate

    check_report_folder(args.out, holds="the run")  # before the model loads (minutes), not after
    run_generate(
        GenerateOptions(
            data=args.data,
            out=args.out,
            model=args.model or DEFAULT_MODEL,
            n_lags=args.n_lags,
            limit=args.limit,
            skip=args.skip,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            shard_size=args.shard_size,
            max_prompt_tokens=args.max_prompt_tokens,
            device=args.device,
            dtype=args.dtype,
            cache_dir=args.cache_dir,
            prompt_style=args.prompt_style,
        )
    )
