"""The default policy's outcome on answers it was not calibrated on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.uncertainty.artifact import load_artifact
from training.policy_outcome import default_policy_outcome, outcome, outcome_markdown


def test_outcome_counts_what_the_threshold_accepts() -> None:
    values = np.array([0.1, 0.2, 0.3, 0.9, np.inf])
    quality = np.array([1.0, 1.0, 0.0, 1.0, 0.0])
    result = outcome(values, quality, threshold=0.5)
    assert result["accepted"] == pytest.approx(0.6)
    assert result["error_accepted"] == pytest.approx(1 / 3)
    assert result["error_all"] == pytest.approx(0.4)
    assert result["correct_kept"] == pytest.approx(2 / 3)
    nothing = outcome(values, quality, threshold=-1.0)
    assert nothing["accepted"] == 0.0 and nothing["error_accepted"] is None


def test_the_default_policy_of_an_artifact(tiny_calibration_artifact: Path) -> None:
    artifact = load_artifact(tiny_calibration_artifact)
    method = artifact.decision_method.value
    values = np.linspace(0, 10, 8)
    quality = np.array([1, 0, 1, 0, 1, 0, 1, 0], dtype=float)
    policy = default_policy_outcome(artifact, {method: values}, quality, {"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]})
    assert policy is not None and policy["method"] == method and policy["target"] == artifact.manifest.default_target
    assert policy["overall"]["n"] == 8 and set(policy["datasets"]) == {"a", "b"}
    assert "| *overall* | 8 |" in outcome_markdown(policy)
    assert default_policy_outcome(artifact, {}, quality, {}) is None  # the method's scores are not there
