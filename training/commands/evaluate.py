"""`python -m training evaluate`: PRR and ROC-AUC of TAD and the baselines per dataset (training/evaluation.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from training.arguments import add_artifact_and_run_options, check_report_folder, int_at_least, run_source_of

NAME = "evaluate"
INTERRUPTED = "finished shards of answers it generated are kept; rerunning resumes them, then scores again"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        help="PRR / ROC-AUC of TAD and baselines per dataset, with rejection-curve plots",
        description="Generates on --data (or reuses --run) and writes report.json, report.md and one "
        "rejection-curve PNG per dataset to --out.",
    )
    parser.add_argument("--out", type=Path, required=True, help="report folder")
    parser.add_argument(
        "--bootstrap", type=int_at_least(0), default=1000, help="paired bootstrap resamples (0: no intervals)"
    )
    parser.add_argument(
        "--compare-artifact",
        type=Path,
        default=None,
        help="another artifact of the same model (e.g. the one deployed): its default score beside this one's, "
        "with the paired difference per dataset",
    )
    add_artifact_and_run_options(parser)
    return parser


def run(args: argparse.Namespace) -> None:
    from training.evaluation import report_markdown, run_evaluate

    check_report_folder(args.out)
    source = run_source_of(args, args.out / "run", "--out")
    report = run_evaluate(args.artifact, source, args.out, args.bootstrap, args.compare_artifact)
    print(report_markdown(report), end="")
