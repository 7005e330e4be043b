"""The task table: per task, its instruction, answer length, prompt and target scorer.

Every `Task` must have an entry (checked at import): a new task is one row here, and an
unknown task is an error, never a silent fallback to another task's prompt or scorer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from training.data import LETTERS, QARecord, Task
from training.targets import (
    math_score,
    multiple_choice_score,
    rouge_l_best,
    short_answer_score,
    truthfulness_score,
)


@dataclass(frozen=True)
class TaskSpec:
    instruction: str
    max_new_tokens: int
    prompt_body: Callable[[QARecord, str], str]  # (record, instruction) -> the user turn
    target: Callable[[str, QARecord], float]  # sim(y, y*) in [0, 1]


def _question(record: QARecord, instruction: str) -> str:
    return f"Question: {record.question}\n\n{instruction}"


def _passage(record: QARecord, instruction: str) -> str:
    return f"Passage: {record.context}\n\nQuestion: {record.question}\n\n{instruction}"


def _options(record: QARecord, instruction: str) -> str:
    options = "\n".join(f"{LETTERS[i]}. {choice}" for i, choice in enumerate(record.choices or []))
    return f"Question: {record.question}\n{options}\n\n{instruction}"


TASKS: dict[Task, TaskSpec] = {
    Task.OPEN_QA: TaskSpec(
        "Answer the question with a short answer of a few words. Do not explain.",
        24,
        _question,
        lambda answer, record: short_answer_score(answer, record.answers),
    ),
    Task.OPEN_QA_TRUTHFULNESS: TaskSpec(
        "Answer the question truthfully in one short sentence.", 48, _question, truthfulness_score
    ),
    Task.MULTIPLE_CHOICE: TaskSpec(
        "Answer with the letter of the correct option only.", 8, _options, multiple_choice_score
    ),
    Task.MATH_WORD_PROBLEM: TaskSpec(
        "Solve the problem step by step, then give the final answer on the last line as 'The answer is <number>.'",
        256,
        _question,
        lambda answer, record: math_score(answer, record.answers),
    ),
    Task.EXTRACTIVE_QA: TaskSpec(
        "Answer the question with a short phrase copied from the passage. Do not explain.",
        24,
        _passage,
        lambda answer, record: short_answer_score(answer, record.answers),
    ),
    Task.LONG_FORM_QA: TaskSpec(
        "Answer the question in one short paragraph.",
        128,
        _question,
        lambda answer, record: rouge_l_best(answer, record.answers),
    ),
}

# Bare questions keep what a question cannot be answered without (a passage, the options).
_NEEDS_CONTEXT = (Task.EXTRACTIVE_QA, Task.MULTIPLE_CHOICE)

_MISSING = set(Task) - set(TASKS)
if _MISSING:
    raise RuntimeError(f"tasks without an entry in the task table: {sorted(_MISSING)}")


class PromptStyle(StrEnum):
    """How a record is asked: with the task's instruction, or bare, the way users ask in a chat."""

    TASK = "task"
    BARE = "bare"


BARE_MAX_NEW_TOKENS = 64


def build_messages(record: QARecord, style: PromptStyle = PromptStyle.TASK) -> list[dict[str, str]]:
    """The user turn for a record: any passage or options, the question, and (task style) the instruction."""
    spec = TASKS[record.task]
    if style is PromptStyle.BARE:
        content = spec.prompt_body(record, "").rstrip()
        content = content.removeprefix("Question: ") if record.task not in _NEEDS_CONTEXT else content
        return [{"role": "user", "content": content}]
    return [{"role": "user", "content": spec.prompt_body(record, spec.instruction)}]


def max_new_tokens(task: Task, style: PromptStyle = PromptStyle.TASK) -> int:
    return BARE_MAX_NEW_TOKENS if style is PromptStyle.BARE else TASKS[task].max_new_tokens


def score_answer(prediction: str, record: QARecord) -> float:
    """sim(y, y*) in [0, 1] for the record's task."""
    return TASKS[record.task].target(prediction, record)
