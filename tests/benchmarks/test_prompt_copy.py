"""The prompt-copy diagnostic: its score and its table on the tiny model's runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.prompt_copy import NOVEL_SHARE, main, novel_word_share, prompt_copy_table


def test_novel_word_share_counts_answer_words_the_prompt_lacks() -> None:
    prompt = "Passage: Ballarat lies in Victoria. Question: Where is Ballarat?"
    assert novel_word_share("Victoria", prompt) == 0.0
    assert novel_word_share("ballarat, VICTORIA", prompt) == 0.0  # case-folded, punctuation ignored
    assert novel_word_share("In New South Wales", prompt) == 0.75  # only "in" is in the prompt
    assert novel_word_share("Sydney", prompt) == 1.0
    assert novel_word_share("...", prompt) == 0.0  # no words: nothing new


def test_table_scores_every_answer_beside_the_baselines(
    tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    rows = prompt_copy_table([tiny_runs["dev"]], resamples=20)
    assert {(row.dataset, row.style) for row in rows} == {("squad", "task"), ("mmlu", "task")}
    for row in rows:
        assert row.n == 16
        assert NOVEL_SHARE in row.prr and "msp" in row.prr and "mean_token_entropy" in row.prr
    main([str(tiny_runs["dev"]), "--bootstrap", "20"])
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 and all("novel-word share PRR" in line for line in printed)
