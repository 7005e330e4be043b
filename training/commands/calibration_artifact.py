"""`python -m training calibration-artifact`: decisions for a model with no trained regressor yet
(training/calibration_artifact.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from training.arguments import (
    RESUMES,
    UsageError,
    add_generation_options,
    coverage,
    int_at_least,
    open_unit,
    prompt_style,
    refuse_generation_options,
)
from training.tasks import PromptStyle

NAME = "calibration-artifact"
INTERRUPTED = RESUMES


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        help="an artifact with no regressor: the free scores' thresholds and a decision method (minutes)",
        description="Generate answers to a few hundred labelled training records (resumable; or reuse --run), "
        "ask the model whether each answer is correct (P(True): one more pass per answer, kept in the run), "
        "choose the decision method on half of the records (P(True), or MSP without it, unless another free "
        "score beats it with a paired 95% interval excluding 0) and certify every threshold on the other half. "
        "The server loads the "
        "artifact like any other: decisions on, TAD null until a regressor is trained.",
    )
    parser.add_argument("--out", type=Path, required=True, help="artifact folder to write")
    parser.add_argument(
        "--data", type=Path, nargs="*", default=[], help="labelled JSONL records to generate on (a train split)"
    )
    parser.add_argument("--run", type=Path, nargs="+", default=[], help="reuse these runs instead of generating")
    parser.add_argument("--run-dir", type=Path, default=None, help="where to generate (default: OUT/calibration-run)")
    parser.add_argument(
        "--prompt-style",
        type=prompt_style,
        choices=tuple(PromptStyle),
        default=PromptStyle.CHAT,
        help="how the records are asked (default chat: the question alone, as users ask)",
    )
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--coverage", type=coverage, nargs="*", default=[0.5, 0.8, 0.9])
    parser.add_argument(
        "--error",
        type=open_unit,
        nargs="*",
        default=[round(0.05 * k, 2) for k in range(1, 19)],
        help="error targets among accepted answers to certify (default 0.05 .. 0.9); the default target is the "
        "strictest certified one that accepts at least half of the correct answers",
    )
    parser.add_argument("--delta", type=open_unit, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--selection-share",
        type=open_unit,
        default=0.5,
        help="share of the records that choose the decision method; the rest certify the thresholds",
    )
    parser.add_argument(
        "--resamples",
        type=int_at_least(10),
        default=2000,
        help="bootstrap resamples (the decision rule reads a tail of 0.05/2K of them for K challengers)",
    )
    parser.add_argument(
        "--no-check-pass",
        action="store_true",
        help="leave P(True) out of the candidates (no second pass per answer; it needs a chat template)",
    )
    add_generation_options(parser)
    return parser


def _run_data_files(runs: list[Path]) -> list[str]:
    """The data files the runs were generated from, as their settings name them (a folder that is not a run is
    refused later, by the command itself)."""
    from training.runs import RUN_FILE, read_run_settings

    files = []
    for run_dir in runs:
        if (Path(run_dir) / RUN_FILE).is_file():
            files += [str(entry["path"]) for entry in read_run_settings(Path(run_dir)).get("data", [])]
    return files


def run(args: argparse.Namespace) -> None:
    if not args.coverage and not args.error:
        raise UsageError("give at least one --coverage or --error target (the artifact decides with its thresholds)")
    if bool(args.data) == bool(args.run):
        raise UsageError("give --data files to generate on, or --run to reuse runs (not both)")
    if args.run:
        refuse_generation_options(
            {
                "--model": args.model,
                "--limit": args.limit,
                "--max-new-tokens": args.max_new_tokens,
                "--run-dir": args.run_dir,
                "--dtype": None if args.dtype == "auto" else args.dtype,
                "--prompt-style": None if args.prompt_style is PromptStyle.CHAT else args.prompt_style,
            }
        )
    dev = [str(path) for path in [*args.data, *_run_data_files(args.run)] if Path(path).name.endswith("_dev.jsonl")]
    if dev:
        # The dev split is what an artifact is judged on: choosing on it would grade the artifact by its own data.
        raise UsageError(f"records come from a train split, never from dev: {', '.join(dev)}")
    from training.calibration_artifact import refuse_trained_artifact

    # Before generating (minutes to hours on a real model), and before a run folder lands inside it.
    refuse_trained_artifact(args.out, UsageError)
    from app.settings import DEFAULT_MODEL
    from training.calibration_artifact import CalibrationArtifactOptions, build_calibration_artifact
    from training.check_pass_scores import CheckPassOptions
    from training.generation import GenerateOptions, run_generate

    runs = list(args.run)
    if not runs:
        runs = [
            run_generate(
                GenerateOptions(
                    data=args.data,
                    out=args.run_dir or args.out / "calibration-run",
                    model=args.model or DEFAULT_MODEL,
                    limit=args.limit,
                    max_new_tokens=args.max_new_tokens,
                    batch_size=args.batch_size,
                    device=args.device,
                    dtype=args.dtype,
                    cache_dir=args.cache_dir,
                    prompt_style=args.prompt_style,
                    out_option="--run-dir",
                )
            )
        ]
    manifest = build_calibration_artifact(
        CalibrationArtifactOptions(
            out=args.out,
            runs=runs,
            coverages=args.coverage,
            errors=args.error,
            delta=args.delta,
            seed=args.seed,
            selection_share=args.selection_share,
            resamples=args.resamples,
            check_pass=None if args.no_check_pass else CheckPassOptions(args.device, args.cache_dir),
        )
    )
    decision = manifest.metrics["decision"]
    interval = decision["interval"]
    shown = "n/a" if interval is None else f"[{interval[0]:+.3f}, {interval[1]:+.3f}]"
    print(f"wrote {args.out}: decides with {decision['chosen']} (best other: {decision['challenger']}, gain {shown})")
    method = manifest.decision_method
    if method is not None and manifest.default_target is not None:
        entry = manifest.thresholds[method][manifest.default_target]
        print(
            f"default target {manifest.default_target}: threshold {entry.threshold:.4f}, accepts "
            f"{entry.coverage:.1%} of the certification answers, {entry.error:.1%} of them wrong"
        )
