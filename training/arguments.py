"""What the commands' parsers share: argparse types that refuse a bad value when it is parsed (not minutes
later as an sklearn or numpy error), the generation options, and turning them into a run source.

Imported by every command module to build its parser, so it imports nothing heavy at the top: `--help`
needs neither the training extra nor torch.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from app.settings import DEFAULT_CACHE_DIR as DEFAULT_CACHE
from app.settings import DEFAULT_MODEL
from training.tasks import PromptStyle

if TYPE_CHECKING:
    from training.run_source import RunSource


class UsageError(Exception):
    """Options that parse one by one but not together: the CLI reports it as argparse does a bad option
    (the command's usage, the message, exit status 2)."""


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type` for integers >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {value})")
        return value

    return parse


def float_in(low: float, high: float, high_included: bool, what: str) -> Callable[[str], float]:
    """An argparse `type` for floats in (low, high] or (low, high)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        # `not (...)` so that nan is refused too.
        if not (low < value and (value <= high if high_included else value < high)):
            raise argparse.ArgumentTypeError(f"must be {what} (got {text})")
        return value

    return parse


positive = float_in(0.0, float("inf"), False, "greater than 0")
coverage = float_in(0.0, 1.0, True, "in (0, 1]")
open_unit = float_in(0.0, 1.0, False, "in (0, 1)")


def prompt_style(text: str) -> PromptStyle:
    """An argparse `type` for --prompt-style: a style's name, or "bare", the chat style's old name."""
    try:
        return PromptStyle(text)
    except ValueError:
        names = ", ".join(style.value for style in PromptStyle)
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {names})") from None


def add_generation_options(parser: argparse.ArgumentParser, with_model: bool = True) -> None:
    if with_model:
        parser.add_argument("--model", default=None, help=f"model spec (default: {DEFAULT_MODEL})")
    parser.add_argument("--limit", type=int_at_least(1), default=None, help="at most this many records per file")
    parser.add_argument("--max-new-tokens", type=int_at_least(1), default=None, help="override the per-task default")
    parser.add_argument(
        "--batch-size",
        type=int_at_least(1),
        default=16,
        help="answers decoding at once; a finished answer's row is refilled at once (continuous batching)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="dequantised GGUF copies")


def add_artifact_and_run_options(parser: argparse.ArgumentParser) -> None:
    """`--artifact`, and where the answers come from: `--data` to generate on, or `--run` to reuse."""
    parser.add_argument("--artifact", type=Path, required=True)
    parser.add_argument("--data", type=Path, nargs="*", default=[], help="JSONL files to generate on")
    parser.add_argument(
        "--run", type=Path, nargs="+", default=[], help="reuse these runs (their texts together) instead of generating"
    )
    parser.add_argument(
        "--prompt-style",
        type=prompt_style,
        choices=tuple(PromptStyle),
        default=None,
        help="how --data's records are asked (as `generate --prompt-style`; default: task): ask them as the "
        "service will be asked (chat, for users' questions; few-shot for a base model)",
    )
    add_generation_options(parser)


def refuse_generation_options(given: dict[str, object]) -> None:
    """With --run nothing is generated: options that shape a generation (given: set to other than their
    default, else None or []) are refused, since dropping them silently would report on other answers than
    the user asked for."""
    ignored = [option for option, value in given.items() if value not in (None, [])]
    if ignored:
        verb, pronoun = ("apply", "them") if len(ignored) > 1 else ("applies", "it")
        raise UsageError(f"{', '.join(ignored)} only {verb} when generating: with --run, leave {pronoun} out")


def run_source_of(args: argparse.Namespace, default_run_dir: Path, run_dir_option: str) -> RunSource:
    """Where evaluate and calibrate get their traces: --run, or a run generated on --data (in
    `default_run_dir`, which the command's `run_dir_option` sets)."""
    from training.run_source import RunSource  # imports the engine: not for --help

    if args.run:
        refuse_generation_options(
            {
                "--data": args.data,
                "--model": args.model,
                "--limit": args.limit,
                "--max-new-tokens": args.max_new_tokens,
                "--prompt-style": args.prompt_style,
                "--run-dir": getattr(args, "run_dir", None),
            }
        )

    return RunSource(
        run_dir_option=run_dir_option,
        data=args.data,
        runs=args.run,
        default_run_dir=default_run_dir,
        model=args.model,
        limit=args.limit,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
        cache_dir=args.cache_dir,
        prompt_style=args.prompt_style or PromptStyle.TASK,
    )


# TargetCentring's values (training/groups.py; tests/training/test_arguments.py checks them), spelled out so
# that --help imports no numpy: fit tries them in this order, lodo refits with one.
CENTRINGS = ("none", "group-0.25", "group-0.5", "group")

# What an interrupted command leaves (each command module's INTERRUPTED): generation keeps finished shards
# (`fit` its finished trials and MLP folds, `lodo` its finished held-out datasets); every command writes its outputs
# whole at the end (an artifact in a side folder swapped in), so an interruption replaces nothing.
RESUMES = "finished shards are kept; rerunning the same command resumes"
STARTS_OVER = "nothing was replaced; rerunning starts over"


def check_report_folder(out: Path, option: str = "--out", holds: str = "the report") -> None:
    """Refuse an output folder (`holds`: what it is for, in the message) that could not be written before the
    work, not after it; nothing is made yet (a command refused later leaves nothing behind)."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{option} {out} is a file: give a folder for {holds}")
    existing = next(folder for folder in (out, *out.absolute().parents) if folder.exists())
    if not existing.is_dir():
        raise UsageError(f"{option} {out} cannot be made: {existing} is a file")
    if not os.access(existing, os.W_OK):
        raise UsageError(f"{option} {out} cannot be written ({existing} is not writable)")
