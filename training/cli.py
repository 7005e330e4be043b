"""`python -m training <command>`: generate, fit, blend, calibrate, evaluate, lodo (each has --help)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app.settings import DEFAULT_CACHE_DIR as DEFAULT_CACHE
from app.settings import DEFAULT_MODEL

if TYPE_CHECKING:
    from collections.abc import Callable

    from training.run_source import RunSource


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type` for integers >= `minimum`: a bad value is refused with the rule, not found
    minutes later as an sklearn or numpy error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {value})")
        return value

    return parse


def _float_in(low: float, high: float, high_included: bool, what: str) -> Callable[[str], float]:
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


_positive = _float_in(0.0, float("inf"), False, "greater than 0")
_coverage = _float_in(0.0, 1.0, True, "in (0, 1]")
_error_rate = _float_in(0.0, 1.0, False, "in (0, 1)")


def _add_generation_options(parser: argparse.ArgumentParser, with_model: bool = True) -> None:
    if with_model:
        parser.add_argument("--model", default=None, help=f"model spec (default: {DEFAULT_MODEL})")
    parser.add_argument("--limit", type=_int_at_least(0), default=None, help="at most this many records per file")
    parser.add_argument("--max-new-tokens", type=_int_at_least(1), default=None, help="override the per-task default")
    parser.add_argument(
        "--batch-size",
        type=_int_at_least(1),
        default=16,
        help="answers decoding at once; a finished answer's row is refilled at once (continuous batching)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="dequantised GGUF copies")


def _add_artifact_and_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--artifact", type=Path, required=True)
    parser.add_argument("--data", type=Path, nargs="*", default=[], help="JSONL files to generate on")
    parser.add_argument(
        "--run", type=Path, nargs="+", default=[], help="reuse these runs (their texts together) instead of generating"
    )
    _add_generation_options(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    commands = parser.add_subparsers(dest="command", required=True)

    generate = commands.add_parser(
        "generate",
        help="answer records with the LLM and store per-token features (resumable)",
        description="Generate greedily for every record, store probabilities, entropies, attention rows "
        "and targets in shards under --out. Rerunning the same command resumes. Under "
        "`accelerate launch` every process takes its share of shards.",
    )
    generate.add_argument("--data", type=Path, nargs="+", required=True, help="JSONL files")
    generate.add_argument("--out", type=Path, required=True, help="run folder")
    generate.add_argument("--n-lags", type=_int_at_least(1), default=10, help="attention lags N to store")
    generate.add_argument("--shard-size", type=_int_at_least(1), default=64, help="records per shard")
    generate.add_argument(
        "--skip",
        type=_int_at_least(0),
        default=0,
        help="valid records per file to pass over first: a second run with --skip N extends one made with "
        "--limit N by disjoint records",
    )
    generate.add_argument("--max-prompt-tokens", type=_int_at_least(1), default=2048)
    generate.add_argument("--dtype", default="auto")
    generate.add_argument(
        "--prompt-style",
        choices=("task", "bare", "few-shot"),
        default="task",
        help="task: the task's instruction (short answers); bare: the question alone, as users ask (64 tokens); "
        "few-shot: k worked examples from each data file's <dataset>_train.jsonl beside it, then the question "
        "(base models, no chat template)",
    )
    _add_generation_options(generate)

    fit = commands.add_parser(
        "fit",
        help="two-stage cross-validated TAD fit; writes an artifact folder",
        description="5-fold CV split by record (both prompt styles of a question in one fold) over "
        "ridge alpha x aggregation x variant "
        "(leak-free, algorithm1-literal, authors) x convention, selected by mean PRR@50%%; writes ARTIFACT_DIR.",
    )
    fit.add_argument("runs", type=Path, nargs="+", help="run folders from `generate` (shards are merged)")
    fit.add_argument("--out", type=Path, required=True, help="artifact folder to write")
    fit.add_argument("--n-lags", type=_int_at_least(1), default=None, help="use fewer lags than the runs store")
    fit.add_argument("--folds", type=_int_at_least(2), default=5)
    fit.add_argument(
        "--fold-unit",
        choices=("record", "text"),
        default="record",
        help="what a fold holds out: whole records (every prompt style of a question together; the default) "
        "or single texts",
    )
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument(
        "--epsilon",
        type=_float_in(0.0, 1.0, False, "in (0, 1)"),
        default=1e-4,
        help="confidences are clipped to [epsilon, 1]",
    )
    fit.add_argument("--alphas", type=_positive, nargs="+", default=None, help="stage-2 ridge L2 grid")
    fit.add_argument(
        "--stage1-alphas", type=_positive, nargs="+", default=None, help="stage-1 grid (default: --alphas)"
    )
    fit.add_argument(
        "--variants",
        nargs="+",
        choices=("leak-free", "algorithm1-literal", "authors"),
        default=["leak-free", "algorithm1-literal", "authors"],
        help="training variants to cross-validate (training/two_stage.py)",
    )
    fit.add_argument("--mlp", action="store_true", help="also search a stage-2 MLP (holds a fold in memory)")
    fit.add_argument(
        "--no-combiner",
        dest="combiner",
        action="store_false",
        help="skip measuring the sequence-level combiner (training/combiner.py) and the decision blend on "
        "out-of-fold TAD scores",
    )
    fit.add_argument("--mlp-width", type=_int_at_least(1), default=256)
    fit.add_argument(
        "--mlp-average",
        action="store_true",
        help="with --mlp: also cross-validate each MLP averaged with the chosen ridge stage 2; the average is "
        "kept under the trial rule (a significant fold-by-fold gain over the model it would replace)",
    )
    fit.add_argument(
        "--force-average",
        action="store_true",
        help="with --mlp-average: install the average even when the trial rule does not keep it (the verdict "
        "is still recorded); the default artifact's was adopted on the dev split this way",
    )
    fit.add_argument("--mlp-grid", choices=("paper", "small"), default="paper", help="MLP hyperparameter grid")
    fit.add_argument(
        "--conventions",
        nargs="+",
        choices=("generating", "consuming"),
        default=["generating", "consuming"],
        help="attention conventions to cross-validate (docs/method.md §2); generating wins unless consuming "
        "beats it by more than its CV std",
    )
    fit.add_argument(
        "--selection",
        choices=("within-group", "pooled"),
        default="within-group",
        help="what CV maximises: mean PRR within each informative dataset/prompt-style group of the held-out "
        "folds, or PRR over the held-out folds pooled (training/groups.py)",
    )
    fit.add_argument(
        "--centrings",
        nargs="+",
        choices=("none", "group-0.25", "group-0.5", "group"),
        default=["none", "group-0.25", "group-0.5", "group"],
        help="target centrings to cross-validate in order (group-S: S of each group's offset from the overall "
        "mean target removed; group: all of it); a later one replaces the one kept so far only by the "
        "trial rule (training/groups.py)",
    )
    fit.add_argument(
        "--weightings",
        nargs="+",
        choices=("token", "text"),
        default=["token", "text"],
        help="row weightings to cross-validate in order after the centring (token: every token row weighs 1; "
        "text: every text weighs the same); a later one replaces the earlier only on a significant "
        "fold-paired gain (training/weighting.py)",
    )

    evaluate = commands.add_parser(
        "evaluate",
        help="PRR / ROC-AUC of TAD and baselines per dataset, with rejection-curve plots",
        description="Generates on --data (or reuses --run) and writes report.json, report.md and one "
        "rejection-curve PNG per dataset to --out.",
    )
    evaluate.add_argument("--out", type=Path, required=True, help="report folder")
    evaluate.add_argument(
        "--bootstrap", type=_int_at_least(0), default=1000, help="paired bootstrap resamples (0: no intervals)"
    )
    evaluate.add_argument(
        "--compare-artifact",
        type=Path,
        default=None,
        help="another artifact of the same model (e.g. the one deployed): its default score beside this one's, "
        "with the paired difference per dataset",
    )
    _add_artifact_and_run_options(evaluate)

    calibrate = commands.add_parser(
        "calibrate",
        help="choose reject thresholds on calibration data and write them into the manifest",
        description="Thresholds for target coverages, and for target error rates among accepted answers "
        "with a Learn-then-Test finite-sample guarantee (probability >= 1 - delta).",
    )
    calibrate.add_argument("--coverage", type=_coverage, nargs="*", default=[0.5, 0.8, 0.9])
    calibrate.add_argument("--error", type=_error_rate, nargs="*", default=[0.3, 0.5])
    calibrate.add_argument("--delta", type=_float_in(0.0, 1.0, False, "in (0, 1)"), default=0.05)
    calibrate.add_argument("--seed", type=int, default=0)
    calibrate.add_argument(
        "--order",
        choices=("natural", "split"),
        default="natural",
        help="fixed-sequence order for error targets: the thresholds' own (whole set) or learned on a half",
    )
    calibrate.add_argument("--default-target", default=None, help="e.g. error@0.3 (default: first feasible)")
    calibrate.add_argument(
        "--run-dir", type=Path, default=None, help="where to generate (default: ARTIFACT/calibration-run)"
    )
    _add_artifact_and_run_options(calibrate)
    blend = commands.add_parser(
        "blend",
        help="choose the decision blend (TAD with baselines) on answers TAD was not fitted on; calibrate next",
        description="Standardised TAD blended with each baseline (and with the unsupervised mean) at each weight; "
        "the best mean PRR within the informative dataset/prompt-style groups (pooled PRR at most 0.02 below "
        "TAD's) is cross-validated by record and installed in the artifact when the trial rule keeps it.",
    )
    blend.add_argument("runs", type=Path, nargs="+", help="runs of answers the regressor was not fitted on")
    blend.add_argument("--artifact", type=Path, required=True)
    blend.add_argument("--weights", type=float, nargs="+", default=None, help="blend weights to try (default 0.1-0.6)")
    blend.add_argument("--folds", type=_int_at_least(2), default=5)
    blend.add_argument("--seed", type=int, default=0)
    blend.add_argument("--force", action="store_true", help="install the chosen blend even if the rule does not")
    blend.add_argument(
        "--candidate", default=None, help="take this candidate (e.g. 'tad + 0.3 perplexity') instead of the grid's best"
    )
    blend.add_argument(
        "--unchecked-training-runs",
        action="store_true",
        help="go on when the artifact's training runs are not on disk, so that these answers cannot be checked "
        "against them (you vouch that they are other answers)",
    )
    lodo = commands.add_parser(
        "lodo",
        help="leave one dataset out: fit on the others, PRR on the held-out one (the generalization table)",
        description="For every dataset: fit TAD with the artifact's configuration on the other datasets' training "
        "runs, score that dataset's test runs, compare with the baselines (paired bootstrap intervals).",
    )
    lodo.add_argument("runs", type=Path, nargs="+", help="training runs")
    lodo.add_argument("--test", type=Path, nargs="+", required=True, help="runs to score (e.g. the dev split)")
    lodo.add_argument("--artifact", type=Path, required=True, help="whose configuration to fit")
    lodo.add_argument("--out", type=Path, required=True)
    lodo.add_argument("--bootstrap", type=_int_at_least(0), default=1000)
    lodo.add_argument("--alpha-stage1", type=_positive, help="fit with this stage-1 alpha instead of the artifact's")
    lodo.add_argument("--alpha", type=_positive, help="fit with this stage-2 alpha instead of the artifact's")
    lodo.add_argument(
        "--centring",
        choices=("none", "group-0.25", "group-0.5", "group"),
        help="fit with this target centring instead of the artifact's",
    )
    lodo.add_argument(
        "--datasets", nargs="+", help="train and test on these datasets alone (default: every dataset in the runs)"
    )
    lodo.add_argument(
        "--held-out",
        nargs="+",
        help="hold out only these datasets, each in turn, still training on every other one (default: each "
        "dataset; one refit per held-out dataset is the cost, minutes for an MLP stage 2)",
    )
    summary = commands.add_parser(
        "summary",
        help="per-dataset accuracy and answer length of generation runs (no artifact needed)",
        description="Reads runs from `generate` and prints, per dataset: texts, accuracy (quality >= 0.5), "
        "mean quality and mean answer tokens.",
    )
    summary.add_argument("runs", type=Path, nargs="+")
    return parser


def _run_source(args: argparse.Namespace, default_run_dir: Path, run_dir_option: str) -> RunSource:
    """Where evaluate and calibrate get their traces: --run, or a run generated on --data (in
    `default_run_dir`, which the command's `run_dir_option` sets)."""
    from training.run_source import RunSource

    if args.run:
        # They shape a generation; with --run nothing is generated, and dropping them silently would report
        # on other answers than the user asked for.
        given = {
            "--data": args.data,
            "--model": args.model,
            "--limit": args.limit,
            "--max-new-tokens": args.max_new_tokens,
            "--run-dir": getattr(args, "run_dir", None),
        }
        ignored = [option for option, value in given.items() if value not in (None, [])]
        if ignored:
            raise SystemExit(f"{', '.join(ignored)} only apply when generating: with --run, leave them out")

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
    )


def _interval_text(ci: list[float] | tuple[float, float] | None) -> str:
    return "[n/a]" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def main(argv: list[str] | None = None) -> None:
    """Run a command; a user's mistake (a missing file, a bad model or artifact, a corrupt run) ends it with
    one line on stderr and exit status 1, Ctrl-C with 130, instead of a traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    from app.engine.loading import ModelLoadError
    from app.uncertainty.artifact import ArtifactError

    try:
        _dispatch(parser, args)
    except KeyboardInterrupt:
        print(f"\ninterrupted: {INTERRUPTED[args.command]}", file=sys.stderr)
        raise SystemExit(130) from None
    except (OSError, ModelLoadError, ArtifactError, json.JSONDecodeError) as error:
        if args.verbose:  # the traceback is what a bug report needs
            raise
        print(f"error: {_describe(error)}", file=sys.stderr)
        raise SystemExit(1) from None


# What an interrupted command leaves: generation keeps finished shards; the others write their outputs whole
# at the end (an artifact in a side folder swapped in), so an interruption replaces nothing.
_RESUMES = "finished shards are kept; rerunning the same command resumes"
_STARTS_OVER = "nothing was replaced; rerunning starts over"
INTERRUPTED = {
    "generate": _RESUMES,
    "evaluate": "finished shards of answers it generated are kept; rerunning resumes them, then scores again",
    "calibrate": "finished shards of answers it generated are kept; rerunning resumes them; the manifest is unchanged",
    "fit": _STARTS_OVER,
    "blend": _STARTS_OVER,
    "lodo": _STARTS_OVER,
    "summary": _STARTS_OVER,
}


def _describe(error: BaseException) -> str:
    """One line for an error a user can fix."""
    if isinstance(error, json.JSONDecodeError):
        # The decoder does not know the file; the runs' own reader names it (training/runs.py).
        return f"a JSON file is corrupt ({error.msg} at line {error.lineno} column {error.colno})"
    if isinstance(error, OSError) and error.filename is not None:
        return f"{error.strerror or type(error).__name__}: {error.filename}"
    return str(error) or type(error).__name__


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.command == "generate":
        from training.commands.generate import GenerateOptions, run_generate
        from training.tasks import PromptStyle

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
                prompt_style=PromptStyle(args.prompt_style),
            )
        )
    elif args.command == "fit":
        from app.uncertainty.features import Convention
        from training.commands.fit import ALPHAS, MLP_GRIDS, FitOptions, run_fit
        from training.folds import FoldUnit
        from training.groups import Selection, TargetCentring
        from training.two_stage import Variant
        from training.weighting import RowWeighting

        if args.mlp_average and not args.mlp:
            parser.error("--mlp-average needs --mlp (it averages the MLP with the ridge stage 2)")
        if args.force_average and not args.mlp_average:
            parser.error("--force-average needs --mlp-average")
        manifest = run_fit(
            FitOptions(
                runs=args.runs,
                out=args.out,
                n_lags=args.n_lags,
                alphas=tuple(args.alphas or ALPHAS),
                folds=args.folds,
                fold_unit=FoldUnit(args.fold_unit),
                seed=args.seed,
                epsilon=args.epsilon,
                mlp=args.mlp,
                mlp_width=args.mlp_width,
                mlp_average=args.mlp_average,
                mlp_average_force=args.force_average,
                mlp_grid=dict(MLP_GRIDS[args.mlp_grid]),
                conventions=tuple(Convention(c) for c in args.conventions),
                variants=tuple(Variant(v) for v in args.variants),
                stage1_alphas=tuple(args.stage1_alphas) if args.stage1_alphas else None,
                combiner=args.combiner,
                selection=Selection(args.selection),
                centrings=tuple(TargetCentring(c) for c in args.centrings),
                weightings=tuple(RowWeighting(w) for w in args.weightings),
            )
        )
        chosen = manifest.metrics["cv"]["chosen"]
        if manifest.regressor.kind == "mlp":
            chosen = manifest.metrics["cv"]["mlp"]["best"]
        elif manifest.regressor.kind == "mlp+ridge":
            chosen = manifest.metrics["cv"]["mlp"]["average"]["best"]
        print(
            f"wrote {args.out}: {manifest.regressor.kind} {manifest.regressor.params}, variant {manifest.variant}, "
            f"aggregation {manifest.aggregation.value}, CV PRR {chosen['prr_mean']:.3f}"
        )
    elif args.command == "evaluate":
        from training.commands.evaluate import report_markdown, run_evaluate

        source = _run_source(args, args.out / "run", "--out")
        report = run_evaluate(args.artifact, source, args.out, args.bootstrap, args.compare_artifact)
        print(report_markdown(report), end="")
    elif args.command == "blend":
        from training.commands.blend import WEIGHTS, run_blend

        weights = tuple(args.weights or WEIGHTS)
        if any(not 0.0 < w < 1.0 for w in weights):
            parser.error("--weights: each must be between 0 and 1")
        manifest = run_blend(
            args.artifact,
            args.runs,
            weights,
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
    elif args.command == "lodo":
        from training.commands.lodo import lodo_markdown, run_lodo
        from training.groups import TargetCentring

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
    elif args.command == "summary":
        from training.commands.summary import summarise

        print(summarise(args.runs), end="")
    elif args.command == "calibrate":
        from training.commands.calibrate import run_calibrate

        if not args.coverage and not args.error:
            parser.error("give at least one --coverage or --error target (none would remove every threshold)")

        source = _run_source(args, args.run_dir or args.artifact / "calibration-run", "--run-dir")
        manifest = run_calibrate(
            args.artifact, source, args.coverage, args.error, args.delta, args.seed, args.default_target, args.order
        )
        decision = manifest.metrics["calibration"]["decision_method"]
        for name, entry in manifest.thresholds.get(decision, {}).items():
            print(
                f"{decision} {name}: threshold {entry.threshold:.4f}, coverage {entry.coverage:.3f}, "
                f"error {entry.error:.3f}"
            )
        print(f"default target: {manifest.default_target}")
