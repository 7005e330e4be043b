"""Artifacts made from the tiny fitted one for tests that need another stage 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from app.uncertainty.tad import AveragedRegressor


def as_mlp_artifact(artifact: Path, out: Path, averaged: bool = False) -> Path:
    """The tiny artifact with its stage-2 ridge replaced by a small MLP, as `fit --mlp` writes one
    (`averaged`: by the mean of the ridge and the MLP, as `fit --mlp --mlp-average` does)."""
    import hashlib
    import warnings

    import joblib
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    shutil.copytree(artifact, out)
    width = int(joblib.load(artifact / "regressor.joblib").n_features_in_)
    rng = np.random.default_rng(0)
    mlp = MLPRegressor(hidden_layer_sizes=(8, 8), max_iter=3, random_state=0)
    with warnings.catch_warnings():  # three epochs do not converge, and need not
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp.fit(rng.normal(size=(64, width)), rng.uniform(size=64))
    ridge = joblib.load(artifact / "regressor.joblib")
    joblib.dump(AveragedRegressor((ridge, mlp)) if averaged else mlp, out / "regressor.joblib")
    manifest = json.loads((out / "manifest.json").read_text())
    kept = {k: v for k, v in manifest["regressor"]["params"].items() if averaged or k != "alpha"}
    config = {"layers": 2, "epochs": 3, "learning_rate": 1e-3, "batch_size": 64, "width": 8}
    kind = "mlp+ridge" if averaged else "mlp"
    manifest["regressor"] = {**manifest["regressor"], "kind": kind, "params": {**config, **kept}}
    manifest["files"]["regressor.joblib"] = hashlib.sha256((out / "regressor.joblib").read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out
