"""The commands' shared argument types."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from training.arguments import CENTRINGS, UsageError, check_report_folder, float_in, int_at_least, prompt_style
from training.groups import TargetCentring
from training.tasks import PromptStyle


def test_centrings_are_the_enums_values_in_the_order_fit_tries_them() -> None:
    assert tuple(c.value for c in TargetCentring) == CENTRINGS


def test_prompt_style_reads_the_chat_styles_old_name() -> None:
    assert prompt_style("bare") is prompt_style("chat") is PromptStyle.CHAT
    with pytest.raises(argparse.ArgumentTypeError, match="choose from task, chat, few-shot"):
        prompt_style("plain")


@pytest.mark.parametrize("text", ["0", "x", "1.5"])
def test_int_at_least_refuses_with_the_rule(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        int_at_least(1)(text)


@pytest.mark.parametrize("text", ["0", "1", "nan", "inf", "y"])
def test_float_in_an_open_interval_refuses_its_ends_and_nan(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        float_in(0.0, 1.0, False, "in (0, 1)")(text)


def test_a_report_folder_that_could_not_be_written_is_refused_and_none_is_made(tmp_path: Path) -> None:
    check_report_folder(tmp_path / "reports" / "dev")
    assert not (tmp_path / "reports").exists()
    (tmp_path / "taken").write_text("")
    with pytest.raises(UsageError, match=r"--out .*taken is a file"):
        check_report_folder(tmp_path / "taken")
    with pytest.raises(UsageError, match=r"cannot be made: .*taken is a file"):
        check_report_folder(tmp_path / "taken" / "below")
