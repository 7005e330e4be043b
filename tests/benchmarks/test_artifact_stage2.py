"""An artifact's own training setup, rebuilt for stage-2 experiments."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.artifact_stage2 import check_training_runs


def test_the_training_runs_must_be_given_in_the_artifacts_order() -> None:
    training = {"runs": ["/elsewhere/runs/train-task-0", "/elsewhere/runs/train-bare-0"]}
    check_training_runs([Path("runs/train-task-0"), Path("runs/train-bare-0")], training)  # moved: same names
    for runs in (["runs/train-bare-0", "runs/train-task-0"], ["runs/train-task-0"]):  # a glob's order; one missing
        with pytest.raises(SystemExit, match="in that order"):
            check_training_runs([Path(run) for run in runs], training)
