"""`python -m training blend`: the decision blend, TAD with baselines, chosen on answers TAD was not fitted on
(training/blending.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from training.arguments import STARTS_OVER, UsageError, int_at_least

NAME = "blend"
INTERRUPTED = STARTS_OVER


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        help="choose the decision blend (TAD with baselines) on answers TAD was not fitted on; calibrate next",
        description="Standardised TAD blended with each baseline (and with the unsupervised mean) at each weight; "
        "the best mean PRR within the informative dataset/prompt-style groups (pooled PRR at most 0.02 below "
        "TAD's) is cross-validated by record and installed in the artifact when the trial rule keeps it.",
    )
    parser.add_argument("runs", type=Path, nargs="+", help="runs of answers the regressor was not fitted on")
    parser.add_argument("--artifact", type=Path, required=True)
    parser.add_argument("--weights", type=float, nargs="+", default=None, help="blend weights to try (default 0.1-0.6)")
    parser.add_argument("--folds", type=int_at_least(2), default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="install the chosen blend even if the rule does not")
    parser.add_argument(
        "--candidate", default=None, help="take this candidate (e.g. 'tad + 0.3 perplexity') instead of the grid's best"
    )
    parser.add_argument(
        "--unchecked-training-runs",
        action="store_true",
        help="go on when the artifact's training runs are not on disk, so that these answers cannot be checked "
        "against them (you vouch that they are other answers)",
    )
    return parser


def _interval_text(ci: list[float] | tuple[float, float] | None) -> str:
    return "[n/a]" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def run(args: argparse.Namespace) -> None:
    if args.weights is not None and any(not 0.0 < w < 1.0 for w in args.weights):
        raise UsageError("--weights: each must be between 0 and 1")
    from training.blending import WEIGHTS, run_blend

    manifest = run_blend(
        args.artifact,
        args.runs,
        tuple(args.weights or WEIGHTS),
        args.folds,
        args.seed,
        args.force,
        candidate=args.candidate,
        unchecked_training_runs=args.unchecked_training_runs,
    )
    result = manifest.metrics["blend"]
    cv = result["cv"]
    print(
        f"chose {result['chosen']}; cross-validated within-group gain over TAD {cv['gain']['mean']:+.3f} "
        f"{_interval_text(cv['gain']['ci95'])}, pooled change {cv['pooled_change']['mean']:+.3f} "
        f"{_interval_text(cv['pooled_change']['ci95'])}: "
        + ("installed (run calibrate next)" if manifest.blend is not None else "not installed")
    )
