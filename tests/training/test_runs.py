"""training/runs.py: what a user is told when runs lack the statistics an artifact or a fit needs."""

from __future__ import annotations

import numpy as np
import pytest

from training.runs import check_statistics


def test_a_study_s_hundreds_of_missing_statistics_are_counted_not_listed() -> None:
    held = {"entropy": np.zeros(3), "logprob": np.zeros(3)}
    wanted = [f"prompt_mass_l{layer:02d}_h{head}" for layer in range(30) for head in range(9)]
    with pytest.raises(SystemExit) as refused:
        check_statistics([held], wanted, "--artifact")
    message = str(refused.value)
    assert message.startswith("--artifact: the runs hold no per-token statistic prompt_mass_l00_h0, ")
    assert "and 265 more (they hold entropy, logprob)" in message and "prompt_mass_l29_h8" not in message


def test_answers_holding_every_wanted_statistic_pass() -> None:
    check_statistics([{"entropy": np.zeros(2)}, {"entropy": np.zeros(1), "x": np.zeros(1)}], ["entropy"], "--x")
