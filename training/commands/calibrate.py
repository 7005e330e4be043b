"""`python -m training calibrate`: reject thresholds written into the artifact's manifest (training/calibration.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from training.arguments import UsageError, add_artifact_and_run_options, coverage, open_unit, run_source_of

NAME = "calibrate"
INTERRUPTED = "finished shards of answers it generated are kept; rerunning resumes them; the manifest is unchanged"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        help="choose reject thresholds on calibration data and write them into the manifest",
        description="Thresholds for target coverages, and for target error rates among accepted answers "
        "with a Learn-then-Test finite-sample guarantee (probability >= 1 - delta).",
    )
    parser.add_argument("--coverage", type=coverage, nargs="*", default=[0.5, 0.8, 0.9])
    parser.add_argument("--error", type=open_unit, nargs="*", default=[0.3, 0.5])
    parser.add_argument("--delta", type=open_unit, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--order",
        choices=("natural", "split"),
        default="natural",
        help="fixed-sequence order for error targets: the thresholds' own (whole set) or learned on a half",
    )
    parser.add_argument(
        "--default-target",
        default=None,
        help="e.g. error@0.3, or keep-half: the strictest certified error target that accepts at least half of "
        "the correct answers (default: the first feasible --error)",
    )
    parser.add_argument(
        "--run-dir", type=Path, default=None, help="where to generate (default: ARTIFACT/calibration-run)"
    )
    add_artifact_and_run_options(parser)
    return parser


def run(args: argparse.Namespace) -> None:
    if not args.coverage and not args.error:
        raise UsageError("give at least one --coverage or --error target (none would remove every threshold)")
    from training.calibration import KEEP_HALF, CalibrationTargets, run_calibrate
    from training.thresholds import coverage_name, error_name

    asked = [*map(coverage_name, args.coverage), *map(error_name, args.error)]
    if args.default_target not in (None, KEEP_HALF, *asked):
        # Checked before generating and calibrating, which take minutes on a real model.
        raise UsageError(
            f"--default-target {args.default_target} is not one of the targets asked for ({', '.join(asked)}) "
            f"nor {KEEP_HALF}"
        )
    source = run_source_of(args, args.run_dir or args.artifact / "calibration-run", "--run-dir")
    targets = CalibrationTargets(args.coverage, args.error, args.delta, args.seed, args.default_target, args.order)
    manifest = run_calibrate(args.artifact, source, targets)
    decision = manifest.metrics["calibration"]["decision_method"]
    for name, entry in manifest.thresholds.get(decision, {}).items():
        print(
            f"{decision} {name}: threshold {entry.threshold:.4f}, coverage {entry.coverage:.3f}, "
            f"error {entry.error:.3f}"
        )
    print(f"default target: {manifest.default_target}")
