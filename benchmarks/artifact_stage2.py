"""An artifact's own training texts and folds, rebuilt for stage-2 experiments, and copies of it
with another stage 2.

A stage-2 experiment on an artifact (another kind of model, more epochs) must see the rows that
`fit` gave the artifact's stage 2: the same training runs, target centring, row weighting,
variant and folds (count, seed and unit from the manifest's `metrics.cv`). Runs other than the
artifact's training runs are refused: centring offsets, row weights and folds are worked out from
the texts given, so other texts would give other rows without a word.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import joblib
import numpy as np

from app.uncertainty.artifact import TadArtifact, load_artifact, read_manifest, write_manifest
from app.uncertainty.tad import Regressor
from training.commands.fit import FitOptions, FoldData, load_runs, prepare_folds, stage1_for_stage2
from training.folds import fold_unit_of_split
from training.groups import TargetCentring, centred
from training.two_stage import FitText, Variant
from training.weighting import RowWeighting, weighted


@dataclass(frozen=True)
class ArtifactFolds:
    """The artifact's centred, weighted training texts and their folds, as `fit` had them."""

    texts: list[FitText]
    data: FoldData
    options: FitOptions
    variant: Variant
    alpha_stage1: float


def check_training_runs(runs: Sequence[Path], training: dict[str, Any]) -> None:
    """Refuse runs other than the artifact's, or in another order: the order of the rows changes the
    MLP's batches and the sums of the Gram matrices (a shell glob sorts `bare` before `task`)."""
    expected = [Path(run).name for run in training.get("runs", [])]
    if expected and [Path(run).name for run in runs] != expected:
        raise SystemExit(f"the artifact was fitted on the runs {expected}: give its training runs, in that order")


def check_training_texts(texts: Sequence[FitText], training: dict[str, Any]) -> None:
    """Refuse texts that are not the artifact's training texts (counted per dataset against its manifest)."""
    counts = Counter(t.dataset for t in texts)
    expected = training.get("datasets")
    if len(texts) != training.get("texts") or (expected is not None and dict(counts) != expected):
        raise SystemExit(
            f"the runs hold {len(texts)} texts ({dict(sorted(counts.items()))}); the artifact was fitted on "
            f"{training.get('texts')} ({expected}): give its training runs"
        )


def artifact_folds(artifact: TadArtifact, runs: Sequence[Path]) -> ArtifactFolds:
    """Load the artifact's training runs and rebuild its folds (see the module docstring)."""
    manifest, spec = artifact.manifest, artifact.scorer.spec
    params = manifest.regressor.params
    check_training_runs(runs, manifest.training)
    texts, _, _ = load_runs(runs, spec.n_lags)
    check_training_texts(texts, manifest.training)
    centring = TargetCentring(params.get("target_centring", TargetCentring.NONE.value))
    texts = weighted(centred(texts, centring), RowWeighting(params.get("row_weighting", RowWeighting.TOKEN.value)))
    variant = Variant.of_manifest(manifest.variant)
    cv = manifest.metrics.get("cv", {})
    options = FitOptions(
        runs=runs,
        out=artifact.path,
        folds=int(cv.get("folds", FitOptions.folds)),
        seed=int(cv.get("seed", FitOptions.seed)),
        fold_unit=fold_unit_of_split(cv.get("split")),
        variants=(variant,),
    )
    return ArtifactFolds(texts, prepare_folds(texts, spec, options), options, variant, float(params["alpha_stage1"]))


def final_stage1_confidences(artifact: TadArtifact, folds: ArtifactFolds) -> list[np.ndarray]:
    """Each training text's earlier confidences as the artifact's final stage 2 was fitted on them: from the
    stage-1 models of every fold but the text's own (`fit`'s `fit_final_mlp` and final ridge)."""
    data = folds.data
    return stage1_for_stage2(
        folds.texts,
        data.fold_of,
        data,
        list(range(data.count)),
        folds.alpha_stage1,
        folds.variant,
        artifact.scorer.spec,
        artifact.manifest.epsilon,
    )


def write_stage2_copy(artifact_dir: Path, out: Path, regressor: Regressor, params: dict[str, Any]) -> None:
    """A copy of the artifact (reports and alternatives left out) with `regressor` as its stage 2 and
    `params` as its regressor parameters, for `training evaluate`.

    The calibrated thresholds belonged to the artifact's own stage 2 and are dropped; the manifest's
    `kind` is kept. The copy is loaded once, so its sizes and hashes are checked.
    """
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(artifact_dir, out, ignore=shutil.ignore_patterns("report", "alternatives"))
    joblib.dump(regressor, out / "regressor.joblib")
    manifest = read_manifest(out)
    info = manifest.regressor.model_copy(update={"params": params})
    write_manifest(out, manifest.model_copy(update={"regressor": info, "thresholds": {}, "default_target": None}))
    load_artifact(out)
