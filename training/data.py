"""Reading QA records (the JSONL format of ../shared/data, documented in docs/training.md, Input).

A line that is not valid JSON, or not a valid record, is reported with its file and line
and skipped; it never stops a run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

logger = logging.getLogger(__name__)


LETTERS = "ABCDEFGHIJ"
MAX_CHOICES = len(LETTERS)


class Task(StrEnum):
    OPEN_QA = "open_qa"
    OPEN_QA_TRUTHFULNESS = "open_qa_truthfulness"
    MULTIPLE_CHOICE = "multiple_choice"
    MATH_WORD_PROBLEM = "math_word_problem"
    EXTRACTIVE_QA = "extractive_qa"
    LONG_FORM_QA = "long_form_qa"


class QARecord(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    answers: list[str] = Field(min_length=1)
    task: Task
    source: str = ""
    context: str | None = None
    choices: list[str] | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _task_fields(self) -> QARecord:
        if self.task is Task.MULTIPLE_CHOICE and not self.choices:
            raise ValueError("multiple_choice records need 'choices'")
        if self.choices is not None and len(self.choices) > MAX_CHOICES:
            raise ValueError(f"at most {MAX_CHOICES} choices (lettered A-J)")
        if self.task is Task.EXTRACTIVE_QA and not self.context:
            raise ValueError("extractive_qa records need 'context'")
        return self


@dataclass(frozen=True)
class LocatedRecord:
    record: QARecord
    dataset: str  # file stem without the split suffix, e.g. "squad" for squad_dev.jsonl
    path: Path
    line: int


@dataclass(frozen=True)
class BadRecord:
    path: Path
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


def dataset_name(path: Path) -> str:
    stem = path.stem
    for suffix in ("_train", "_dev", "_test", "_heldout", "_validation"):
        if stem.endswith(suffix):
            return stem[: -len(suffix)]
    return stem


def read_records(
    paths: Sequence[Path], limit: int | None = None, bad: list[BadRecord] | None = None, skip: int = 0
) -> Iterator[LocatedRecord]:
    """Valid records of every file in order, at most `limit` per file after the first `skip` valid
    ones (so a later run can extend an earlier one with disjoint records); bad lines go to `bad`."""
    for path in paths:
        taken = 0
        skipped = 0
        with Path(path).open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if limit is not None and taken >= limit:
                    break
                if not raw.strip():
                    continue
                try:
                    record = QARecord.model_validate(json.loads(raw.decode("utf-8")))
                except UnicodeDecodeError:
                    _report(bad, BadRecord(Path(path), number, "not valid UTF-8"))
                    continue
                except json.JSONDecodeError as error:
                    _report(bad, BadRecord(Path(path), number, f"invalid JSON ({error.msg})"))
                    continue
                except ValidationError as error:
                    reason = "; ".join(
                        f"{'.'.join(str(p) for p in item['loc']) or 'record'}: {item['msg']}" for item in error.errors()
                    )
                    _report(bad, BadRecord(Path(path), number, f"invalid record ({reason})"))
                    continue
                if skipped < skip:
                    skipped += 1
                    continue
                taken += 1
                yield LocatedRecord(record=record, dataset=dataset_name(Path(path)), path=Path(path), line=number)


def _report(bad: list[BadRecord] | None, item: BadRecord) -> None:
    logger.warning("skipping %s", item)
    if bad is not None:
        bad.append(item)
