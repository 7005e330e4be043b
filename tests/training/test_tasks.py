"""The task table (training/tasks.py): every task has a prompt, a length and a target scorer."""

import pytest

from tests.training.test_targets import _mc_record, _record, _truthful_record
from training.data import Task
from training.tasks import TASKS, build_messages, score_answer


def test_every_task_has_an_entry_and_a_prompt():
    assert set(TASKS) == set(Task)
    for task in Task:
        record = _record(task, ["x"], context="a passage") if task is not Task.MULTIPLE_CHOICE else _mc_record("A")
        (message,) = build_messages(record)
        assert message["role"] == "user" and record.question in message["content"]


# --- dispatch -------------------------------------------------------------------------------------


def test_score_answer_open_and_extractive_qa_use_short_answer_rules():
    open_qa = _record(Task.OPEN_QA, ["Thames River"])
    assert score_answer("It is the Thames river.", open_qa) == 1.0
    assert score_answer("the river Thames in London", open_qa) == pytest.approx(2 / 3)
    extractive = _record(Task.EXTRACTIVE_QA, ["1596"], context="Warsaw became the capital in 1596.")
    assert score_answer("in 1596", extractive) == 1.0
    assert score_answer("1597", extractive) == 0.0


def test_score_answer_multiple_choice():
    # A short-answer rule would give "B" vs "Bird" no credit.
    record = _mc_record("B")
    assert score_answer("B", record) == 1.0
    assert score_answer("A", record) == 0.0


def test_score_answer_math_uses_final_number():
    # Containment would give 1 (the text contains "12"); the final-number rule gives 0.
    record = _record(Task.MATH_WORD_PROBLEM, ["12"])
    assert score_answer("3 + 9 = 12, so the answer is 13.", record) == 0.0
    assert score_answer("3 + 9 = 12. The answer is 12.", record) == 1.0


def test_score_answer_truthfulness_is_binary():
    # Token F1 against "Nothing happens if you swallow gum" would be fractional; this rule gives 1.
    record = _truthful_record(["Gum stays in your stomach for seven years"])
    assert score_answer("nothing happens", record) == 1.0


def test_score_answer_long_form_uses_best_rouge_l():
    record = _record(Task.LONG_FORM_QA, ["the cat sat on the mat", "dogs bark loudly"])
    # Best of 2/3 (LCS "the cat sat" against the first reference) and 0 (against the second).
    assert score_answer("the cat sat", record) == pytest.approx(2 / 3)


def test_bare_style_asks_the_question_alone_but_keeps_passage_and_options():
    from training.tasks import BARE_MAX_NEW_TOKENS, PromptStyle, max_new_tokens

    open_qa = _record(Task.OPEN_QA, ["x"])
    (message,) = build_messages(open_qa, PromptStyle.BARE)
    assert message["content"] == open_qa.question
    extractive = _record(Task.EXTRACTIVE_QA, ["x"], context="a passage")
    assert "a passage" in build_messages(extractive, PromptStyle.BARE)[0]["content"]
    assert "Bird" in build_messages(_mc_record("B"), PromptStyle.BARE)[0]["content"]
    assert max_new_tokens(Task.MULTIPLE_CHOICE, PromptStyle.BARE) == BARE_MAX_NEW_TOKENS
    assert max_new_tokens(Task.MULTIPLE_CHOICE) == 8
