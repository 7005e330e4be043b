"""`python -m training fit`: two-stage cross-validated TAD fit; writes an artifact folder (training/fit/)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from training.arguments import CENTRINGS, UsageError, int_at_least, open_unit, positive

if TYPE_CHECKING:
    from training.fit.options import FitOptions

NAME = "fit"
# Each trial's cross-validation (training/fit/cross_validation.py) and the MLP's folds (fold_progress.py) are kept.
INTERRUPTED = (
    "nothing was replaced; rerunning the same fit resumes its finished trials (and, with --mlp, its finished MLP folds)"
)
# The values of the enums in training/ (Variant, Convention, RowWeighting; tests/training/commands/test_fit.py
# checks them), spelled out so that --help imports no numpy.
VARIANTS = ("leak-free", "algorithm1-literal", "authors")
CONVENTIONS = ("generating", "consuming")
WEIGHTINGS = ("token", "text")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        NAME,
        help="two-stage cross-validated TAD fit; writes an artifact folder",
        description="5-fold CV split by record (both prompt styles of a question in one fold) over "
        "ridge alpha x aggregation x variant "
        "(leak-free, algorithm1-literal, authors) x convention, selected by mean PRR@50%; writes ARTIFACT_DIR.",
    )
    parser.add_argument("runs", type=Path, nargs="+", help="run folders from `generate` (shards are merged)")
    parser.add_argument("--out", type=Path, required=True, help="artifact folder to write")
    parser.add_argument("--n-lags", type=int_at_least(1), default=None, help="use fewer lags than the runs store")
    parser.add_argument("--folds", type=int_at_least(2), default=5)
    parser.add_argument(
        "--fold-unit",
        choices=("record", "text"),
        default="record",
        help="what a fold holds out: whole records (every prompt style of a question together; the default) "
        "or single texts",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--epsilon",
        type=open_unit,
        default=1e-4,
        help="confidences are clipped to [epsilon, 1]",
    )
    parser.add_argument("--alphas", type=positive, nargs="+", default=None, help="stage-2 ridge L2 grid")
    parser.add_argument(
        "--stage1-alphas", type=positive, nargs="+", default=None, help="stage-1 grid (default: --alphas)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS),
        help="training variants to cross-validate (training/two_stage.py)",
    )
    parser.add_argument("--mlp", action="store_true", help="also search a stage-2 MLP (holds a fold in memory)")
    parser.add_argument("--mlp-width", type=int_at_least(1), help="with --mlp: the hidden layers' width (256)")
    parser.add_argument(
        "--mlp-average",
        action="store_true",
        help="with --mlp: also cross-validate each MLP averaged with the chosen ridge stage 2; the average is "
        "kept under the trial rule (a significant fold-by-fold gain over the model it would replace)",
    )
    parser.add_argument(
        "--force-average",
        action="store_true",
        help="with --mlp-average: install the average even when the trial rule does not keep it (the verdict "
        "is still recorded); the SmolLM2-135M artifact's was adopted on the dev split this way",
    )
    parser.add_argument(
        "--mlp-grid", choices=("paper", "small"), help="with --mlp: the MLP hyperparameter grid (paper)"
    )
    parser.add_argument(
        "--conventions",
        nargs="+",
        choices=CONVENTIONS,
        default=list(CONVENTIONS),
        help="attention conventions to cross-validate (docs/method.md §2); generating wins unless consuming "
        "beats it by more than its CV std",
    )
    parser.add_argument(
        "--selection",
        choices=("within-group", "pooled"),
        default="within-group",
        help="what CV maximises: mean PRR within each informative dataset/prompt-style group of the held-out "
        "folds, or PRR over the held-out folds pooled (training/groups.py)",
    )
    parser.add_argument(
        "--centrings",
        nargs="+",
        choices=CENTRINGS,
        default=list(CENTRINGS),
        help="target centrings to cross-validate in order (group-S: S of each group's offset from the overall "
        "mean target removed; group: all of it); a later one replaces the one kept so far only by the "
        "trial rule (training/groups.py)",
    )
    parser.add_argument(
        "--weightings",
        nargs="+",
        choices=WEIGHTINGS,
        default=list(WEIGHTINGS),
        help="row weightings to cross-validate in order after the centring (token: every token row weighs 1; "
        "text: every text weighs the same); a later one replaces the earlier only on a significant "
        "fold-paired gain (training/weighting.py)",
    )
    return parser


def options_of(args: argparse.Namespace) -> FitOptions:
    """The fit the command line asks for; options that need another one refused as argparse refuses a bad one."""
    from app.uncertainty.features import Convention
    from training.fit.options import ALPHAS, MLP_GRIDS, FitOptions
    from training.folds import FoldUnit
    from training.groups import Selection, TargetCentring
    from training.two_stage import Variant
    from training.weighting import RowWeighting

    given = [name for name, value in (("--mlp-width", args.mlp_width), ("--mlp-grid", args.mlp_grid)) if value]
    if given and not args.mlp:
        raise UsageError(f"{' and '.join(given)} {'need' if len(given) > 1 else 'needs'} --mlp (ignored without it)")
    if args.mlp_average and not args.mlp:
        raise UsageError("--mlp-average needs --mlp (it averages the MLP with the ridge stage 2)")
    if args.force_average and not args.mlp_average:
        raise UsageError("--force-average needs --mlp-average")
    return FitOptions(
        runs=args.runs,
        out=args.out.resolve(),  # `.` or `..` has no name for the staging folder beside it
        n_lags=args.n_lags,
        alphas=tuple(args.alphas or ALPHAS),
        folds=args.folds,
        fold_unit=FoldUnit(args.fold_unit),
        seed=args.seed,
        epsilon=args.epsilon,
        mlp=args.mlp,
        mlp_width=args.mlp_width or FitOptions.mlp_width,
        mlp_average=args.mlp_average,
        mlp_average_force=args.force_average,
        mlp_grid=dict(MLP_GRIDS[args.mlp_grid or "paper"]),
        conventions=tuple(Convention(c) for c in args.conventions),
        variants=tuple(Variant(v) for v in args.variants),
        stage1_alphas=tuple(args.stage1_alphas) if args.stage1_alphas else None,
        selection=Selection(args.selection),
        centrings=tuple(TargetCentring(c) for c in args.centrings),
        weightings=tuple(RowWeighting(w) for w in args.weightings),
    )


def run(args: argparse.Namespace) -> None:
    from app.uncertainty.artifact import load_artifact
    from training.fit.pipeline import run_fit

    manifest = run_fit(options_of(args))
    served = manifest.metrics["cv"]["served"]
    trained = load_artifact(args.out).trained()
    print(
        f"wrote {args.out}: {trained.regressor.kind} {trained.regressor.params}, variant {trained.variant}, "
        f"aggregation {trained.aggregation.value}, CV PRR {served['prr_mean']:.3f}"
    )
