"""`python -m training generate`: its parser."""

from __future__ import annotations

import pytest

from training.cli import build_parser
from training.tasks import PromptStyle

ARGV = ["generate", "--data", "d.jsonl", "--out", "run"]


@pytest.mark.parametrize(
    ("given", "style"), [("task", "task"), ("chat", "chat"), ("bare", "chat"), ("few-shot", "few-shot")]
)
def test_prompt_style_chat_is_also_accepted_by_its_old_name(given: str, style: str) -> None:
    assert build_parser().parse_args([*ARGV, "--prompt-style", given]).prompt_style is PromptStyle(style)


def test_an_unknown_prompt_style_is_refused_when_parsed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args([*ARGV, "--prompt-style", "plain"])
    assert stop.value.code == 2
    assert (
        "argument --prompt-style: invalid choice: 'plain' (choose from task, chat, few-shot)" in capsys.readouterr().err
    )
