"""A third kind of stage 2, measured: gradient-boosted trees beside an artifact's ridge and MLP.

The default artifact's stage 2 is the mean of a ridge and an MLP (README, "Ridge and MLP
averaged"). Trees split on thresholds of single inputs, which neither of them does, so they are
the natural third member. This fits one tree ensemble (scikit-learn's
`HistGradientBoostingRegressor`, hyperparameters fixed below and never tuned) on the artifact's
own stage-2 rows: the same training runs, variant, stage-1 alpha, target centring and row
weighting, with each text's earlier confidences from the out-of-fold stage-1 models exactly as
`fit` gives its final stage 2. Rows are subsampled to at most `--rows-per-text` per text, each
kept row's weight scaled so that every text keeps its total weight (for the default artifact's
6,218 texts, 90,053 rows and about 15 minutes on 2 cores; the time grows with the rows).

The runs must be the artifact's training runs in its manifest's order (checked by name, and
their texts counted against it; benchmarks/artifact_stage2.py), and the folds are the
artifact's own (count, seed and unit from its manifest); `--seed` draws only the subsampled rows
and the trees.

Three artifacts are written under --out, each a copy of --artifact with another stage 2:
`trees3` (the mean of the ridge, the MLP and the trees), `trees-ridge` (ridge and trees) and
`trees-alone`. They are for `training evaluate` only: their manifests keep the artifact's `kind`
(the manifest schema names no trees, since none is served), `params.stage2_members` says what the
stage 2 is, and the calibrated thresholds, which belonged to the artifact's own stage 2, are
dropped. Compare them with `training evaluate --compare-artifact <the artifact>` on dev runs; set
OMP_NUM_THREADS=1 there: the trees predict one row per token, and under torch's thread pool each
call costs ten times more.

    python -m benchmarks.stage2_trees --artifact DIR --out DIR RUN [RUN ...]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sklearn.ensemble import HistGradientBoostingRegressor

from app.uncertainty.artifact import TadArtifact, load_artifact, read_manifest
from app.uncertainty.features import FeatureSpec
from app.uncertainty.tad import AveragedRegressor, Regressor
from benchmarks.artifact_stage2 import artifact_folds, final_stage1_confidences, write_stage2_copy
from training.commands.fit import MLP_CONFIG_KEYS
from training.two_stage import FitText, stage2_matrix

# Fixed before the first fit, with the rule that judged them (README, "Trees as a third member"), never tuned.
TREE_PARAMS = {
    "max_iter": 300,
    "learning_rate": 0.05,
    "max_leaf_nodes": 31,
    "min_samples_leaf": 400,  # a chat answer has up to 63 rows, all with its target: leaves span many texts
    "l2_regularization": 1.0,
    "early_stopping": False,
}
ROWS_PER_TEXT = 16
# The manifest parameters of each member kind: what a copy keeps of them depends on the members it has.
MLP_PARAMS = (*MLP_CONFIG_KEYS, "width", "seeds", "standardised_inputs")
RIDGE_PARAMS = ("alpha",)


def subsampled_rows(
    texts: Sequence[FitText], confidences: Sequence[np.ndarray], spec: FeatureSpec, rows_per_text: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stage-2 rows, targets and weights with at most `rows_per_text` rows of each text (chosen uniformly),
    every text keeping the total weight of its rows."""
    rng = np.random.default_rng(seed)
    features, targets, weights = [], [], []
    for text, text_confidences in zip(texts, confidences, strict=True):
        rows = max(len(text) - 1, 0)
        if rows == 0:
            continue
        kept = np.sort(rng.choice(rows, size=min(rows, rows_per_text), replace=False))
        matrix, target, _ = stage2_matrix([text], [text_confidences], spec)
        features.append(matrix[kept])
        targets.append(target[kept])
        weights.append(np.full(len(kept), text.row_weight * rows / len(kept)))
    return np.concatenate(features), np.concatenate(targets), np.concatenate(weights)


def fit_trees(artifact: TadArtifact, runs: Sequence[Path], rows_per_text: int, seed: int) -> Regressor:
    """The tree ensemble on the artifact's stage-2 rows (see the module docstring)."""
    folds = artifact_folds(artifact, runs)
    confidences = final_stage1_confidences(artifact, folds)
    features, targets, weights = subsampled_rows(folds.texts, confidences, artifact.scorer.spec, rows_per_text, seed)
    print(f"{len(targets)} stage-2 rows of {len(folds.texts)} texts", flush=True)
    trees = HistGradientBoostingRegressor(random_state=seed, **TREE_PARAMS)
    return trees.fit(features, targets, sample_weight=weights)


def write_variant(artifact_dir: Path, out: Path, regressor: Regressor, members: Sequence[str]) -> None:
    """A copy of the artifact with `regressor` as its stage 2 (`write_stage2_copy`).

    The manifest's `kind` is left as it was (the manifest schema names no trees: none is served);
    `params.stage2_members` says what the stage 2 is and `params.trees` how the trees were fitted.
    """
    params = read_manifest(artifact_dir).regressor.params
    dropped = (() if "mlp" in members else MLP_PARAMS) + (() if "ridge" in members else RIDGE_PARAMS)
    kept = {key: value for key, value in params.items() if key not in dropped}
    write_stage2_copy(artifact_dir, out, regressor, {**kept, "stage2_members": list(members), "trees": TREE_PARAMS})


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="the artifact's training runs")
    parser.add_argument("--artifact", type=Path, required=True, help="an artifact whose stage 2 is a ridge and an MLP")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows-per-text", type=int, default=ROWS_PER_TEXT)
    parser.add_argument("--seed", type=int, default=0, help="draws the subsampled rows and the trees")
    args = parser.parse_args(argv)
    if args.rows_per_text < 1:
        parser.error("--rows-per-text must be at least 1")
    artifact = load_artifact(args.artifact)
    if artifact.manifest.regressor.kind != "mlp+ridge":
        parser.error("--artifact: its stage 2 must be the mean of a ridge and an MLP (fit --mlp --mlp-average)")
    stage2: tuple[Regressor, ...] = artifact.scorer.regressor.members  # type: ignore[attr-defined]
    started = time.monotonic()
    trees = fit_trees(artifact, args.runs, args.rows_per_text, args.seed)
    print(f"trees fitted in {time.monotonic() - started:.0f} s", flush=True)
    ridge, mlp = stage2
    for name, members, regressor in (
        ("trees3", ("ridge", "mlp", "trees"), AveragedRegressor((ridge, mlp, trees))),
        ("trees-ridge", ("ridge", "trees"), AveragedRegressor((ridge, trees))),
        ("trees-alone", ("trees",), trees),
    ):
        write_variant(args.artifact, args.out / name, regressor, members)
        print(f"wrote {args.out / name}", flush=True)


if __name__ == "__main__":
    main()
