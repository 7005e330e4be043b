"""The paper's MLP grid a line at a time (epochs from one fit), cross-validated on an artifact's own folds.

The default artifact's MLP is one point of the paper's 36-point grid (2 or 4 layers, 10-30
epochs, learning rates 1e-5 to 5e-5, batch 64 or 128): 10 epochs at the highest learning rate and
the smallest batch. Running the whole grid takes about a day on 2 cores; this measures it a line at
a time, at a fraction of that cost: the layers, learning rate and batch size are fixed per run
(the artifact's unless given), and on each fold one network is trained for the most epochs asked
for, copies of its weights taken at the end of every earlier epoch asked for (`EpochSnapshots`).
A copy is bit-identical to a network fitted with that many epochs (scikit-learn draws the same
initial weights and batch orders, and its early stop on a flat training loss is honoured), so one
fit gives every point of the epochs axis.

Each fold replicates `fit`'s MLP cross-validation (`training.commands.fit.mlp_search`) on the
artifact's own folds: the held-out fold's texts are scored by the MLP alone and by its mean with
the ridge refitted on the other folds (the shipped kind), for every aggregation, within the
informative groups and pooled. Per fold about 20 minutes for 30 epochs of the default
configuration on 2 cores (a fold's ~260,000 x 2,721 training matrix in memory, about 6 GB).
Results are appended to --out as one JSON line per fold, configuration (layers, learning rate, batch
size), epoch count and stage 2; a rerun skips the folds with every count asked already there at
the same layers, learning rate and batch size.
Where the artifact's own configuration and epochs are among those asked, the fold's PRRs must
reproduce its manifest's (`fit`'s cross-validation), or the run stops.

With --write DIR instead of --out, the MLP is refitted on all the artifact's stage-2 rows, as `fit`
fits its final MLP (about 25 minutes for 30 epochs), and a copy of the artifact is written per
epoch count, its stage 2 the artifact's ridge averaged with the refitted MLP, for `training
evaluate --compare-artifact`. Where the configuration and epochs are the artifact's own, the refitted MLP is
checked to be the artifact's to the bit.

    python -m benchmarks.mlp_epochs RUN [RUN ...] --artifact DIR --out FILE.jsonl --folds 0 1 2 --epochs 10 20 30
    python -m benchmarks.mlp_epochs RUN [RUN ...] --artifact DIR --out FILE.jsonl --learning-rate 1e-5 --batch-size 128
    python -m benchmarks.mlp_epochs RUN [RUN ...] --artifact DIR --write DIR --epochs 10 20 30
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor

from app.uncertainty.artifact import TadArtifact, load_artifact
from app.uncertainty.tad import AveragedRegressor, Regressor, TadScorer
from benchmarks.artifact_stage2 import ArtifactFolds, artifact_folds, final_stage1_confidences, write_stage2_copy
from training.commands.fit import held_out_prr, stage1_for_stage2
from training.ridge import fit_ridge
from training.two_stage import cross_stats, stage2_matrix, stage2_stats


class EpochSnapshots(MLPRegressor):
    """An `MLPRegressor` that keeps a copy of itself at the end of each epoch in `snapshot_epochs`.

    scikit-learn calls `_update_no_improvement_count` once at the end of every epoch, after the
    epoch's loss is recorded; nothing else is changed, so training is the plain one.
    """

    # Set after construction, not an __init__ parameter: scikit-learn's parameters are the MLP's own.
    snapshot_epochs: tuple[int, ...] = ()

    def _update_no_improvement_count(self, *args: Any, **kwargs: Any) -> None:
        super()._update_no_improvement_count(*args, **kwargs)
        if self.n_iter_ in self.snapshot_epochs:
            self.snapshots_[self.n_iter_] = plain_copy(self, self.n_iter_)

    def fit(self, *args: Any, **kwargs: Any) -> EpochSnapshots:
        self.snapshots_: dict[int, MLPRegressor] = {}
        return super().fit(*args, **kwargs)


def plain_copy(model: MLPRegressor, epochs: int) -> MLPRegressor:
    """A plain `MLPRegressor` with `model`'s current weights, as fitted with `max_iter=epochs` (it pickles
    without this module and the scorer's split path takes it)."""
    plain = MLPRegressor(**{**model.get_params(), "max_iter": epochs})
    for key, value in vars(model).items():
        if key.endswith("_") and not key.startswith("_") and key != "snapshots_":  # fitted attributes
            setattr(plain, key, copy.deepcopy(value))  # the weights too: training goes on updating them in place
    return plain


def mlp_snapshots(
    config: dict[str, Any],
    width: int,
    seed: int,
    epochs: Sequence[int],
    features: np.ndarray,
    targets: np.ndarray,
    weights: np.ndarray | None,
) -> dict[int, MLPRegressor]:
    """Networks of `config` (its own epochs ignored) after each of `epochs`, from one fit; an epoch count
    past scikit-learn's stop on a flat training loss gets the stopped network, as a fit with that count
    would. A fit that ends early for any other reason (an interrupt, which scikit-learn only warns of), or
    whose snapshots were not taken (the private hook renamed in another version), is refused."""
    model = EpochSnapshots(
        hidden_layer_sizes=(width,) * int(config["layers"]),
        learning_rate_init=float(config["learning_rate"]),
        max_iter=max(epochs),
        batch_size=int(config["batch_size"]),
        random_state=seed,
    )
    model.snapshot_epochs = tuple(epochs)
    with warnings.catch_warnings():  # the paper's epoch counts stop before scikit-learn's tolerance
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(features, targets, sample_weight=weights)
    trained = int(model.n_iter_)
    stopped_flat = model._no_improvement_count > model.n_iter_no_change
    if trained < max(epochs) and not stopped_flat:
        raise RuntimeError(f"the MLP stopped after {trained} of {max(epochs)} epochs without converging")
    taken = model.snapshots_
    missing = [count for count in epochs if count <= trained and count not in taken]
    if missing:
        raise RuntimeError(f"no snapshot was taken after epochs {missing}: is scikit-learn's epoch hook renamed?")
    return {count: taken[count] if count in taken else plain_copy(model, count) for count in epochs}


def unsupported(artifact: TadArtifact) -> str | None:
    """Why the artifact's stage 2 cannot be measured here, or None: a ridge and one MLP on raw inputs."""
    params = artifact.manifest.regressor.params
    if artifact.manifest.regressor.kind != "mlp+ridge":
        return "its stage 2 must be the mean of a ridge and an MLP (fit --mlp --mlp-average)"
    if int(params.get("seeds", 1)) != 1:
        return "its MLP member averages several seeds (fit --mlp-seeds); this measures one network"
    if params.get("standardised_inputs"):
        return "its MLP was fitted on standardised inputs (fit --mlp-standardise); this fits on raw ones"
    return None


def grid_point(config: dict[str, Any]) -> tuple[int, float, int, int]:
    """A configuration's point of the grid, comparable whatever types a manifest or a row holds: layers,
    learning rate, batch size, epochs."""
    return (
        int(config["layers"]),
        float(config["learning_rate"]),
        int(config["batch_size"]),
        int(config["epochs"]),
    )


def recorded_fold_prr(artifact: TadArtifact, fold: int) -> dict[tuple[str, str], float | None]:
    """The artifact's own cross-validated PRRs of `fold` within groups, by (stage 2, aggregation), from its
    manifest (`fit`'s MLP cross-validation): the rows of its own grid point and one seed, of the many a
    searched grid records."""
    own = grid_point(artifact.manifest.regressor.params)
    grid = artifact.manifest.metrics.get("cv", {}).get("mlp", {}).get("grid", [])
    return {
        (row["stage2"], row["aggregation"]): row["within_group_prr_folds"][fold]
        for row in grid
        if grid_point(row) == own and int(row.get("seeds", 1)) == 1
    }


def row_key(artifact: TadArtifact, row: dict[str, Any]) -> tuple[int, int, float, int, int]:
    """What identifies a row for resuming: fold, layers, learning rate, batch size and epochs (rows written
    before the learning rate and batch size were recorded have the artifact's)."""
    params = artifact.manifest.regressor.params
    legacy = {"learning_rate": params["learning_rate"], "batch_size": params["batch_size"]}
    return (int(row["fold"]), *grid_point({**legacy, **row}))


def check_reproduced(artifact: TadArtifact, rows: Sequence[dict[str, Any]]) -> None:
    """Refuse rows of the artifact's own configuration that do not reproduce its manifest's fold PRRs: then
    the replication of `fit` is wrong, and no other row of the fold can be trusted."""
    own = grid_point(artifact.manifest.regressor.params)
    for row in rows:
        if row_key(artifact, row)[1:] != own:
            continue
        recorded = recorded_fold_prr(artifact, row["fold"])
        for aggregation, value in row["within-group"].items():
            expected = recorded.get((row["stage2"], aggregation))
            same = math.isnan(value) if expected is None else abs(value - expected) <= 1e-9
            if (row["stage2"], aggregation) in recorded and not same:
                raise SystemExit(
                    f"fold {row['fold']}: {row['stage2']} {aggregation} gives {value}, the manifest {expected}: "
                    "this does not reproduce fit's cross-validation"
                )


def mlp_config(artifact: TadArtifact, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """The artifact's MLP configuration with `changes` (layers, learning_rate, batch_size) applied; a
    change of None keeps the artifact's value."""
    params = artifact.manifest.regressor.params
    given = {key: value for key, value in (changes or {}).items() if value is not None}
    unknown = set(given) - {"layers", "learning_rate", "batch_size"}
    if unknown:
        raise ValueError(f"not an MLP setting measured here: {sorted(unknown)}")
    return {**params, **given}


def final_snapshots(
    artifact: TadArtifact,
    folds: ArtifactFolds,
    epochs: Sequence[int],
    seed: int,
    changes: dict[str, Any] | None = None,
) -> dict[int, MLPRegressor]:
    """The artifact's final MLP (with `changes`, see `mlp_config`) refitted on all its stage-2 rows, as `fit`
    fits it (`training.commands.fit.fit_final_mlp`), after each of `epochs`."""
    confidences = final_stage1_confidences(artifact, folds)
    features, targets, weights = stage2_matrix(folds.texts, confidences, artifact.scorer.spec)
    width = int(artifact.manifest.regressor.params.get("width", 256))
    return mlp_snapshots(mlp_config(artifact, changes), width, seed, epochs, features, targets, weights)


def network_config(network: MLPRegressor) -> dict[str, Any]:
    """The grid point a fitted network is: hidden layers, learning rate, batch size and epochs."""
    return {
        "layers": len(network.coefs_) - 1,
        "learning_rate": float(network.learning_rate_init),
        "batch_size": int(network.batch_size),
        "epochs": int(network.max_iter),
    }


def copy_name(config: dict[str, Any]) -> str:
    """The folder name of an artifact copy for a grid point, e.g. layers-2-epochs-10-lr-5e-05-batch-64."""
    layers, epochs, rate, batch = (config[key] for key in ("layers", "epochs", "learning_rate", "batch_size"))
    return f"layers-{layers}-epochs-{epochs}-lr-{float(rate):g}-batch-{batch}"


def write_final_copies(artifact: TadArtifact, networks: dict[int, MLPRegressor], out: Path) -> dict[str, bool]:
    """Per network a copy of the artifact whose stage 2 is its ridge averaged with the network, under
    `out/<copy_name>`; returns, per copy, whether its network is the artifact's own MLP to the bit
    (to be checked where the grid point is the artifact's: then the refit must be `fit`'s)."""
    ridge, own = artifact.scorer.regressor.members  # type: ignore[attr-defined]
    params = artifact.manifest.regressor.params
    identical: dict[str, bool] = {}
    for network in networks.values():
        point = network_config(network)
        name = copy_name(point)
        copied = {**params, **point}
        write_stage2_copy(artifact.path, out / name, AveragedRegressor((ridge, network)), copied)
        identical[name] = len(network.coefs_) == len(own.coefs_) and all(
            np.array_equal(a, b)
            for a, b in zip(network.coefs_ + network.intercepts_, own.coefs_ + own.intercepts_, strict=True)
        )
    return identical


def fold_rows(
    artifact: TadArtifact,
    folds: ArtifactFolds,
    fold: int,
    epochs: Sequence[int],
    seed: int,
    changes: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One held-out fold: per epoch count, the PRRs of the MLP (the artifact's configuration with `changes`,
    see `mlp_config`) and of its mean with the fold's ridge."""
    spec, data, params = artifact.scorer.spec, folds.data, artifact.manifest.regressor.params
    config = mlp_config(artifact, changes)
    epsilon = artifact.manifest.epsilon
    train, train_folds = data.texts_without(fold, folds.texts)
    available = [g for g in range(data.count) if g != fold]
    confidences = stage1_for_stage2(
        train, train_folds, data, available, folds.alpha_stage1, folds.variant, spec, epsilon
    )
    ridge = fit_ridge(
        stage2_stats(data.static_without(fold), cross_stats(train, [confidences], spec), 0, spec),
        float(params["alpha"]),
    )
    features, targets, weights = stage2_matrix(train, confidences, spec)
    started = time.monotonic()
    networks = mlp_snapshots(config, int(params.get("width", 256)), seed, epochs, features, targets, weights)
    fit_seconds = time.monotonic() - started
    del features, targets, weights
    rows = []
    for network in networks.values():
        stage2: dict[str, Regressor] = {"mlp": network, "mlp+ridge": AveragedRegressor((ridge, network))}
        for kind, regressor in stage2.items():
            scored = held_out_prr(TadScorer(regressor, spec, epsilon), data.groups[fold], data.informative)
            rows.append(
                {
                    "fold": fold,
                    **network_config(network),  # as fitted
                    "stage2": kind,
                    "trained_epochs": int(network.n_iter_),
                    "fit_seconds": round(fit_seconds, 1),
                    **{metric.value: {a.value: v for a, v in by.items()} for metric, by in scored.items()},
                }
            )
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="the artifact's training runs")
    parser.add_argument("--artifact", type=Path, required=True, help="an artifact whose stage 2 is a ridge and an MLP")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--out",
        type=Path,
        help="cross-validate: JSON lines, appended to (a fold with every count asked at this grid point is skipped)",
    )
    target.add_argument(
        "--write", type=Path, help="refit on all rows instead and write a copy of the artifact per epoch count here"
    )
    parser.add_argument("--folds", type=int, nargs="+", help="held-out folds to run (default: all)")
    parser.add_argument("--epochs", type=int, nargs="+", default=[10, 20, 30])
    parser.add_argument("--layers", type=int, help="hidden layers (default: the artifact's)")
    parser.add_argument("--learning-rate", type=float, help="Adam's initial learning rate (default: the artifact's)")
    parser.add_argument("--batch-size", type=int, help="minibatch rows (default: the artifact's)")
    args = parser.parse_args(argv)
    if min(args.epochs) < 1:
        parser.error("--epochs must be at least 1")
    if args.layers is not None and args.layers < 1:
        parser.error("--layers must be at least 1")
    if args.learning_rate is not None and not 0 < args.learning_rate < 1:
        parser.error("--learning-rate must be between 0 and 1")
    if args.batch_size is not None and args.batch_size < 1:
        parser.error("--batch-size must be at least 1")
    artifact = load_artifact(args.artifact)
    reason = unsupported(artifact)
    if reason is not None:
        parser.error(f"--artifact: {reason}")
    epochs = sorted(set(args.epochs))
    changes = {"layers": args.layers, "learning_rate": args.learning_rate, "batch_size": args.batch_size}
    point = grid_point({**mlp_config(artifact, changes), "epochs": 0})[:3]  # layers, learning rate, batch
    if args.write is not None:
        folds = artifact_folds(artifact, args.runs)
        networks = final_snapshots(artifact, folds, epochs, folds.options.seed, changes)
        identical = write_final_copies(artifact, networks, args.write)
        for name, same in identical.items():
            print(f"wrote {args.write / name} (its MLP is the artifact's own: {same})", flush=True)
        own = grid_point(artifact.manifest.regressor.params)
        for network in networks.values():
            name = copy_name(network_config(network))
            if grid_point(network_config(network)) == own and not identical[name]:
                raise SystemExit(f"{name}: the refitted MLP is not the artifact's own: this is not fit's refit")
        return
    done: set[tuple[int, int, float, int, int]] = set()
    if args.out.exists():
        rows = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
        done = {row_key(artifact, row) for row in rows}
    folds = artifact_folds(artifact, args.runs)
    wanted = args.folds if args.folds is not None else list(range(folds.data.count))
    bad = [f for f in wanted if not 0 <= f < folds.data.count]
    if bad:
        parser.error(f"--folds: the artifact has {folds.data.count} folds, not {bad}")
    seed = folds.options.seed
    for fold in wanted:
        if all((fold, *point, count) in done for count in epochs):
            print(f"fold {fold}: already in {args.out}", flush=True)
            continue
        rows = fold_rows(artifact, folds, fold, epochs, seed, changes)
        check_reproduced(artifact, rows)
        with args.out.open("a") as sink:
            for row in rows:
                sink.write(json.dumps(row) + "\n")
        for row in rows:
            print(
                f"fold {fold} epochs {row['epochs']:>2} {row['stage2']:<9} within-group mean-log "
                f"{row['within-group']['mean-log']:.4f} pooled {row['pooled']['mean-log']:.4f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
