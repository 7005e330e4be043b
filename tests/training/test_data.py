"""Reading QA records from JSONL (training/data.py)."""

import json

import pytest
from pydantic import ValidationError

from training.data import BadRecord, QARecord, Task, dataset_name, read_records


def _good(record_id, **fields):
    record = {"id": record_id, "question": f"Question {record_id}?", "answers": ["yes"], "task": "open_qa"}
    record.update(fields)
    return json.dumps(record)


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def squad_file(tmp_path):
    return _write(
        tmp_path / "squad_dev.jsonl",
        [
            _good("a1", task="extractive_qa", context="Some passage.", meta={"title": "T"}),  # line 1
            '{"id": "broken", "question": ',  # line 2: invalid JSON
            json.dumps({"id": "b", "question": "No answers?", "task": "open_qa"}),  # line 3: no answers
            json.dumps({"id": "c", "question": "Which?", "answers": ["x"], "task": "multiple_choice"}),  # line 4
            "",  # line 5: blank
            "   ",  # line 6: whitespace only
            _good("a2", extra_field="ignored"),  # line 7
        ],
    )


def test_valid_records_with_dataset_and_line_numbers(squad_file):
    bad = []
    located = list(read_records([squad_file], bad=bad))
    assert [item.record.id for item in located] == ["a1", "a2"]
    assert [item.line for item in located] == [1, 7]
    assert {item.dataset for item in located} == {"squad"}
    assert {item.path for item in located} == {squad_file}
    first = located[0].record
    assert first.task is Task.EXTRACTIVE_QA
    assert first.context == "Some passage."
    assert first.meta == {"title": "T"}


def test_bad_lines_are_reported_with_path_and_line(squad_file):
    bad = []
    list(read_records([squad_file], bad=bad))
    assert [(item.path, item.line) for item in bad] == [(squad_file, 2), (squad_file, 3), (squad_file, 4)]
    assert all(isinstance(item, BadRecord) for item in bad)
    assert "invalid JSON" in bad[0].reason
    assert "invalid record" in bad[1].reason and "answers" in bad[1].reason
    assert "choices" in bad[2].reason
    assert str(bad[0]).startswith(f"{squad_file}:2: ")


def test_bad_lines_do_not_need_a_list(squad_file):
    assert [item.line for item in read_records([squad_file])] == [1, 7]


def test_limit_is_per_file_and_counts_valid_records(tmp_path):
    first = _write(tmp_path / "triviaqa_train.jsonl", ["not json", _good("t1"), _good("t2"), _good("t3")])
    second = _write(tmp_path / "gsm8k_dev.jsonl", [_good("g1", task="math_word_problem"), _good("g2")])
    bad = []
    located = list(read_records([first, second], limit=2, bad=bad))
    assert [(item.dataset, item.record.id, item.line) for item in located] == [
        ("triviaqa", "t1", 2),
        ("triviaqa", "t2", 3),
        ("gsm8k", "g1", 1),
        ("gsm8k", "g2", 2),
    ]
    assert [(item.path, item.line) for item in bad] == [(first, 1)]
    assert [item.record.id for item in read_records([first, second], limit=1)] == ["t1", "g1"]
    assert list(read_records([first], limit=0)) == []


def test_skip_passes_over_valid_records_per_file_so_runs_extend_without_overlap(tmp_path):
    first = _write(tmp_path / "triviaqa_train.jsonl", ["not json", _good("t1"), _good("t2"), _good("t3")])
    second = _write(tmp_path / "gsm8k_dev.jsonl", [_good("g1", task="math_word_problem"), _good("g2")])
    earlier = [item.record.id for item in read_records([first, second], limit=2)]
    later = [item.record.id for item in read_records([first, second], limit=2, skip=2)]
    assert later == ["t3"]
    assert not set(earlier) & set(later)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("squad_dev.jsonl", "squad"),
        ("nq_open_train.jsonl", "nq_open"),
        ("mmlu_heldout.jsonl", "mmlu"),
        ("x_validation.jsonl", "x"),
        ("x_test.jsonl", "x"),
        ("custom.jsonl", "custom"),
        ("dev_squad.jsonl", "dev_squad"),
    ],
)
def test_dataset_name(tmp_path, name, expected):
    assert dataset_name(tmp_path / name) == expected


def test_task_specific_validation():
    with pytest.raises(ValidationError, match="choices"):
        QARecord(id="1", question="q", answers=["a"], task=Task.MULTIPLE_CHOICE)
    with pytest.raises(ValidationError, match="context"):
        QARecord(id="1", question="q", answers=["a"], task=Task.EXTRACTIVE_QA)
    with pytest.raises(ValidationError):
        QARecord(id="1", question="q", answers=[], task=Task.OPEN_QA)
    with pytest.raises(ValidationError):
        QARecord(id="", question="q", answers=["a"], task=Task.OPEN_QA)
    with pytest.raises(ValidationError):
        QARecord(id="1", question="q", answers=["a"], task="poetry")
    record = QARecord(id="1", question="q", answers=["a"], task="multiple_choice", choices=["a", "b"])
    assert record.task is Task.MULTIPLE_CHOICE


def test_non_object_json_is_a_bad_record(tmp_path):
    path = _write(tmp_path / "odd_dev.jsonl", ["[1, 2]", "null", _good("ok")])
    bad = []
    assert [item.record.id for item in read_records([path], bad=bad)] == ["ok"]
    assert [item.line for item in bad] == [1, 2]


def test_undecodable_line_is_reported_not_raised(tmp_path):
    path = tmp_path / "bytes_dev.jsonl"
    path.write_bytes(_good("a").encode() + b"\n" + b'{"id": "\xff"}\n' + _good("b").encode() + b"\n")
    bad = []
    assert [item.record.id for item in read_records([path], bad=bad)] == ["a", "b"]
    assert [item.line for item in bad] == [2]


def test_more_than_ten_choices_is_a_bad_record(tmp_path):
    record = {
        "id": "x",
        "question": "q",
        "answers": ["a"],
        "task": "multiple_choice",
        "choices": [str(i) for i in range(11)],
    }
    path = tmp_path / "mc_dev.jsonl"
    path.write_text(json.dumps(record) + "\n")
    bad = []
    assert list(read_records([path], bad=bad)) == []
    assert len(bad) == 1 and "choices" in bad[0].reason
