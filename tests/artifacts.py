"""Artifacts made from the tiny fitted one for tests that need another stage 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from app.uncertainty.tad import AveragedRegressor


def as_mlp_artifact(
    artifact: Path, out: Path, averaged: bool = False, seeds: int = 1, standardised: bool = False
) -> Path:
    """The tiny artifact with its stage-2 ridge replaced by a small MLP, as `fit --mlp` writes one
    (`averaged`: by the mean of the ridge and the MLP, as `fit --mlp --mlp-average` does; `seeds` > 1: the
    MLP member the mean of that many MLPs, as `--mlp-seeds` installs it; `standardised`: recorded as fitted on
    standardised inputs, as `--mlp-standardise` does)."""
    import hashlib
    import warnings

    import joblib
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    shutil.copytree(artifact, out)
    width = int(joblib.load(artifact / "regressor.joblib").n_features_in_)
    rng = np.random.default_rng(0)
    networks = []
    for seed in range(seeds):
        network = MLPRegressor(hidden_layer_sizes=(8, 8), max_iter=3, random_state=seed)
        with warnings.catch_warnings():  # three epochs do not converge, and need not
            warnings.simplefilter("ignore", ConvergenceWarning)
            network.fit(rng.normal(size=(64, width)), rng.uniform(size=64))
        networks.append(network)
    mlp = networks[0] if seeds == 1 else AveragedRegressor(tuple(networks))
    ridge = joblib.load(artifact / "regressor.joblib")
    joblib.dump(AveragedRegressor((ridge, mlp)) if averaged else mlp, out / "regressor.joblib")
    manifest = json.loads((out / "manifest.json").read_text())
    kept = {k: v for k, v in manifest["regressor"]["params"].items() if averaged or k != "alpha"}
    config = {"layers": 2, "epochs": 3, "learning_rate": 1e-3, "batch_size": 64, "width": 8}
    if seeds > 1:
        config["seeds"] = seeds
    if standardised:
        config["standardised_inputs"] = True
    kind = "mlp+ridge" if averaged else "mlp"
    manifest["regressor"] = {**manifest["regressor"], "kind": kind, "params": {**config, **kept}}
    manifest["files"]["regressor.joblib"] = hashlib.sha256((out / "regressor.joblib").read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def studied_artifact(train_run: Path, folder: Path, statistics: tuple[str, ...], like: Path) -> Path:
    """An artifact of the tiny model (the convention of the artifact `like`) fitted with per-token `statistics`
    that only an annotated copy of `train_run` holds (each a copy of its entropy), as `fit --extra-stats` on a
    study's runs writes one: neither generation nor the server computes them."""
    from app.uncertainty.artifact import read_manifest
    from training.commands.fit import FitOptions, run_fit

    annotated = folder / "annotated-run"
    shutil.copytree(train_run, annotated)
    for entropy in annotated.glob("shards/*/stat-entropy.npy"):
        for name in statistics:
            shutil.copy(entropy, entropy.with_name(f"stat-{name}.npy"))
    out = folder / "studied-tad"
    options = FitOptions(
        runs=[annotated],
        out=out,
        alphas=(1.0,),
        conventions=(read_manifest(like).features.convention,),
        extra_stats=statistics,
        extra_feature_sets=(),
        combiner=False,
    )
    run_fit(options)
    return out
