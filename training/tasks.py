"""The task table: per task, its instruction, answer length, prompt and target scorer.

Every `Task` must have an entry (checked at import): a new task is one row here, and an
unknown task is an error, never a silent fallback to another task's prompt or scorer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
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
        lambda answer, record: short_answer_score(answer, record.answers, record.question),
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
        lambda answer, record: short_answer_score(answer, record.answers, record.question),
    ),
    Task.LONG_FORM_QA: TaskSpec(
        "Answer the question in one short paragraph.",
        128,
        _question,
        lambda answer, record: rouge_l_best(answer, record.answers),
    ),
}

# Chat-style questions keep what a question cannot be answered without (a passage, the options).
_NEEDS_CONTEXT = (Task.EXTRACTIVE_QA, Task.MULTIPLE_CHOICE)

_MISSING = set(Task) - set(TASKS)
if _MISSING:
    raise RuntimeError(f"tasks without an entry in the task table: {sorted(_MISSING)}")


class PromptStyle(StrEnum):
    """How a record is asked: with the task's instruction, as users ask in a chat (the question alone), or
    k-shot for base models without a chat template (the paper's prompting)."""

    TASK = "task"
    CHAT = "chat"
    FEW_SHOT = "few-shot"

    @classmethod
    def _missing_(cls, value: object) -> PromptStyle | None:
        # "bare" is what the chat style was called before: runs made then say so in their run.json and
        # texts.json, and must read as the same style as runs made since (one group, one answer key).
        return cls.CHAT if value == OLD_CHAT_NAME else None


OLD_CHAT_NAME = "bare"


# A chat answer's budget: at least this, and the task's own where that is longer (a worked math
# solution or a paragraph cut at 64 tokens would be scored wrong for its length, not its content).
CHAT_MAX_NEW_TOKENS = 64
# Shots per task (the paper's appendix: 5-shot for short answers; fewer where examples are long).
FEW_SHOT_COUNT: dict[Task, int] = {
    Task.OPEN_QA: 5,
    Task.OPEN_QA_TRUTHFULNESS: 5,
    Task.MULTIPLE_CHOICE: 5,
    Task.MATH_WORD_PROBLEM: 5,
    Task.EXTRACTIVE_QA: 1,
    Task.LONG_FORM_QA: 2,
}
# A base model continues the pattern with the next question: its answer ends where that turn starts.
FEW_SHOT_STOP = ("\nQuestion:", "\n\n")
_CALCULATOR = re.compile(r"<<[^>]*>>")


@dataclass(frozen=True)
class Prompt:
    """One record as the model is asked: chat messages, or a raw text (few-shot); stop strings."""

    messages: list[dict[str, str]] | None = None
    text: str | None = None
    stop: tuple[str, ...] = ()


def _shot_answer(record: QARecord) -> str:
    """The reference answer as a worked example shows it."""
    if record.task is Task.MULTIPLE_CHOICE and record.choices and record.answers[0] in record.choices:
        return LETTERS[record.choices.index(record.answers[0])]
    if record.task is Task.MATH_WORD_PROBLEM and record.meta.get("rationale"):
        steps = _CALCULATOR.sub("", str(record.meta["rationale"])).split("####")[0].strip()
        return f"{steps}\nThe answer is {record.answers[0]}."
    if record.task is Task.OPEN_QA_TRUTHFULNESS and record.meta.get("best_answer"):
        return str(record.meta["best_answer"])
    return record.answers[0]


def _turn(record: QARecord) -> str:
    """Passage and options if the task has them, then the question, ending with 'Answer:'."""
    parts = [f"Passage: {record.context}"] if record.task is Task.EXTRACTIVE_QA else []
    parts.append(f"Question: {record.question}")
    if record.task is Task.MULTIPLE_CHOICE:
        parts += [f"{LETTERS[i]}. {choice}" for i, choice in enumerate(record.choices or [])]
    return "\n".join(parts) + "\nAnswer:"


def few_shot_prompt(record: QARecord, pool: Sequence[QARecord]) -> str:
    """k worked examples of the record's task from `pool` (never the record itself), then the record."""
    shots = [shot for shot in pool if shot.id != record.id and shot.task is record.task][: FEW_SHOT_COUNT[record.task]]
    examples = [f"{_turn(shot)} {_shot_answer(shot)}" for shot in shots]
    return "\n\n".join([*examples, _turn(record)])


def build_prompt(record: QARecord, style: PromptStyle, pool: Sequence[QARecord] = ()) -> Prompt:
    """How `record` is asked in `style`; few-shot examples come from `pool` (a train split)."""
    if style is PromptStyle.FEW_SHOT:
        return Prompt(text=few_shot_prompt(record, pool), stop=FEW_SHOT_STOP)
    return Prompt(messages=build_messages(record, style))


def build_messages(record: QARecord, style: PromptStyle = PromptStyle.TASK) -> list[dict[str, str]]:
    """The user turn for a record: any passage or options, the question, and (task style) the instruction."""
    spec = TASKS[record.task]
    if style is PromptStyle.CHAT:
        content = spec.prompt_body(record, "").rstrip()
        content = content.removeprefix("Question: ") if record.task not in _NEEDS_CONTEXT else content
        return [{"role": "user", "content": content}]
    return [{"role": "user", "content": spec.prompt_body(record, spec.instruction)}]


def max_new_tokens(task: Task, style: PromptStyle = PromptStyle.TASK) -> int:
    own = TASKS[task].max_new_tokens
    return max(CHAT_MAX_NEW_TOKENS, own) if style is PromptStyle.CHAT else own


def score_answer(prediction: str, record: QARecord) -> float:
    """sim(y, y*) in [0, 1] for the record's task."""
    return TASKS[record.task].target(prediction, record)
