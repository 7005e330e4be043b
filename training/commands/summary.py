"""`python -m training summary`: per-dataset accuracy and answer length of generation runs (training/run_summary.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from training.arguments import STARTS_OVER

NAME = "summary"
INTERRUPTED = STARTS_OVER


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        help="per-dataset accuracy and answer length of generation runs (no artifact needed)",
        description="Reads runs from `generate` and prints, per dataset: texts, accuracy (quality >= 0.5), "
        "mean quality and mean answer tokens.",
    )
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument(
        "--informative",
        action="store_true",
        help="print only the names of the datasets whose accuracy lies in [0.1, 0.9], one line, for scripts",
    )
    return parser


def run(args: argparse.Namespace) -> None:
    from training.run_summary import informative_datasets, summarise

    print(
        " ".join(informative_datasets(args.runs)) if args.informative else summarise(args.runs),
        end="\n" if args.informative else "",
    )
