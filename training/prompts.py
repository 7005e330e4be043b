"""Prompt templates per task, as chat messages (the model's chat template is applied by the engine)."""

from __future__ import annotations

from training.data import QARecord, Task

LETTERS = "ABCDEFGHIJ"

_INSTRUCTIONS: dict[Task, str] = {
    Task.OPEN_QA: "Answer the question with a short answer of a few words. Do not explain.",
    Task.OPEN_QA_TRUTHFULNESS: "Answer the question truthfully in one short sentence.",
    Task.MULTIPLE_CHOICE: "Answer with the letter of the correct option only.",
    Task.MATH_WORD_PROBLEM: (
        "Solve the problem step by step, then give the final answer on the last line as 'The answer is <number>.'"
    ),
    Task.EXTRACTIVE_QA: "Answer the question with a short phrase copied from the passage. Do not explain.",
    Task.LONG_FORM_QA: "Answer the question in one short paragraph.",
}


def build_messages(record: QARecord) -> list[dict[str, str]]:
    """The user turn for a record: task instruction, any passage or options, the question."""
    instruction = _INSTRUCTIONS[record.task]
    if record.task is Task.EXTRACTIVE_QA:
        body = f"Passage: {record.context}\n\nQuestion: {record.question}\n\n{instruction}"
    elif record.task is Task.MULTIPLE_CHOICE:
        options = "\n".join(f"{LETTERS[i]}. {choice}" for i, choice in enumerate(record.choices or []))
        body = f"Question: {record.question}\n{options}\n\n{instruction}"
    else:
        body = f"Question: {record.question}\n\n{instruction}"
    return [{"role": "user", "content": body}]


DEFAULT_MAX_NEW_TOKENS: dict[Task, int] = {
    Task.OPEN_QA: 24,
    Task.OPEN_QA_TRUTHFULNESS: 48,
    Task.MULTIPLE_CHOICE: 8,
    Task.MATH_WORD_PROBLEM: 256,
    Task.EXTRACTIVE_QA: 24,
    Task.LONG_FORM_QA: 128,
}
