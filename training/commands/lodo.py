"""`python -m training lodo`: leave one dataset out, the paper's generalization table (training/leave_one_out.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from training.arguments import CENTRINGS, check_report_folder, int_at_least, positive

NAME = "lodo"
INTERRUPTED = "nothing was replaced; rerunning the same lodo resumes its finished held-out datasets"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        help="leave one dataset out: fit on the others, PRR on the held-out one (the generalization table)",
        description="For every dataset: fit TAD with the artifact's configuration on the other datasets' training "
        "runs, score that dataset's test runs, compare with the baselines (paired bootstrap intervals).",
    )
    parser.add_argument("runs", type=Path, nargs="+", help="training runs")
    parser.add_argument("--test", type=Path, nargs="+", required=True, help="runs to score (e.g. the dev split)")
    parser.add_argument("--artifact", type=Path, required=True, help="whose configuration to fit")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--bootstrap", type=int_at_least(0), default=1000)
    parser.add_argument("--alpha-stage1", type=positive, help="fit with this stage-1 alpha instead of the artifact's")
    parser.add_argument("--alpha", type=positive, help="fit with this stage-2 alpha instead of the artifact's")
    parser.add_argument(
        "--centring",
        choices=CENTRINGS,
        help="fit with this target centring instead of the artifact's",
    )
    parser.add_argument(
        "--datasets", nargs="+", help="train and test on these datasets alone (default: every dataset in the runs)"
    )
    parser.add_argument(
        "--held-out",
        nargs="+",
        help="hold out only these datasets, each in turn, still training on every other one (default: each "
        "dataset; one refit per held-out dataset is the cost, minutes for an MLP stage 2)",
    )
    return parser


def run(args: argparse.Namespace) -> None:
    from training.groups import TargetCentring
    from training.leave_one_out import lodo_markdown, run_lodo

    check_report_folder(args.out)
    report = run_lodo(
        args.runs,
        args.test,
        args.artifact,
        args.out,
        args.bootstrap,
        alpha_stage1=args.alpha_stage1,
        alpha=args.alpha,
        centring=None if args.centring is None else TargetCentring(args.centring),
        only_datasets=args.datasets,
        held_out=args.held_out,
    )
    print(lodo_markdown(report), end="")
