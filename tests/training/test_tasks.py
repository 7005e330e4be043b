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


def test_chat_style_asks_the_question_alone_but_keeps_passage_and_options():
    from training.tasks import CHAT_MAX_NEW_TOKENS, PromptStyle, max_new_tokens

    open_qa = _record(Task.OPEN_QA, ["x"])
    (message,) = build_messages(open_qa, PromptStyle.CHAT)
    assert message["content"] == open_qa.question
    extractive = _record(Task.EXTRACTIVE_QA, ["x"], context="a passage")
    assert "a passage" in build_messages(extractive, PromptStyle.CHAT)[0]["content"]
    assert "Bird" in build_messages(_mc_record("B"), PromptStyle.CHAT)[0]["content"]
    assert max_new_tokens(Task.MULTIPLE_CHOICE, PromptStyle.CHAT) == CHAT_MAX_NEW_TOKENS
    assert max_new_tokens(Task.MULTIPLE_CHOICE) == 8
    # A worked solution is not cut shorter in a chat than under the task's instruction.
    assert max_new_tokens(Task.MATH_WORD_PROBLEM, PromptStyle.CHAT) == max_new_tokens(Task.MATH_WORD_PROBLEM) == 256


def test_bare_is_the_chat_styles_old_name():
    """Runs made before the rename store "bare": read back, it is the chat style."""
    from training.tasks import PromptStyle

    assert PromptStyle("bare") is PromptStyle.CHAT and PromptStyle.CHAT.value == "chat"
    with pytest.raises(ValueError):
        PromptStyle("plain")


def test_few_shot_prompt_has_k_examples_of_the_task_never_the_record_itself():
    from training.data import QARecord
    from training.tasks import FEW_SHOT_COUNT, FEW_SHOT_STOP, PromptStyle, build_prompt

    def record(i: int, task: Task = Task.OPEN_QA) -> QARecord:
        return QARecord(id=f"t{i}", question=f"question {i}?", answers=[f"answer {i}"], task=task)

    pool = [record(0, Task.MATH_WORD_PROBLEM), *(record(i) for i in range(1, 8))]
    asked = record(3)  # in the pool: must not be its own example
    prompt = build_prompt(asked, PromptStyle.FEW_SHOT, pool)
    assert prompt.messages is None and prompt.stop == FEW_SHOT_STOP
    text = prompt.text or ""
    shots = [f"Question: question {i}?\nAnswer: answer {i}" for i in (1, 2, 4, 5, 6)]
    assert len(shots) == FEW_SHOT_COUNT[Task.OPEN_QA]
    assert text == "\n\n".join([*shots, "Question: question 3?\nAnswer:"])
    assert "answer 3" not in text and "question 0" not in text  # not itself, not another task


def test_few_shot_examples_show_letters_and_worked_solutions():
    from training.data import QARecord
    from training.tasks import few_shot_prompt

    mc = _mc_record("C")
    shot = _mc_record("B").model_copy(update={"id": "shot"})
    assert few_shot_prompt(mc, [shot]).split("\n\n")[0].endswith("Answer: B")
    math = QARecord(
        id="m1",
        question="2 + 3?",
        answers=["5"],
        task=Task.MATH_WORD_PROBLEM,
        meta={"rationale": "2 + 3 = <<2+3=5>>5\n#### 5"},
    )
    asked = math.model_copy(update={"id": "m2"})
    assert "Answer: 2 + 3 = 5\nThe answer is 5.\n\nQuestion: 2 + 3?" in few_shot_prompt(asked, [math])
