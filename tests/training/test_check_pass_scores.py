"""P(True) of stored answers: the check the server asks, rebuilt from the run, kept in the run and resumed."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.engine.engine import Engine
from app.serving.check_pass import CHECK_PROMPT, YES
from training.check_pass_scores import CheckPassOptions, _Checker, cache_key, p_true_values, question_of
from training.runs import CHECK_PASS_FILE, RUN_FILE, iter_texts


@pytest.fixture
def run(tmp_path: Path, tiny_runs: dict[str, Path]) -> Path:
    copy = tmp_path / "train"
    shutil.copytree(tiny_runs["train"], copy)
    return copy


def test_the_question_is_the_user_turn_the_answer_was_generated_for(tiny_runs: dict[str, Path], engine: Engine) -> None:
    for text in list(iter_texts([tiny_runs["train"]]))[:6]:
        prompt = engine.encode_prompt(messages=[{"role": "user", "content": question_of(text)}])
        assert len(prompt) == text.meta["prompt_tokens"]


def test_each_value_is_one_minus_the_probability_of_yes_after_the_check(run: Path, engine: Engine) -> None:
    texts = list(iter_texts([run]))[:5]
    values = p_true_values([run], texts, CheckPassOptions(batch_size=2))
    for text, value in zip(texts, values, strict=True):
        check = CHECK_PROMPT.format(question=question_of(text), answer=text.meta["answer"])
        prompt = engine.encode_prompt(messages=[{"role": "user", "content": check}])
        (trace,) = engine.score([(prompt, engine.encode_answer(YES)[:1])])
        assert value == pytest.approx(1.0 - math.exp(float(trace.logprobs[0])), abs=1e-5)


def test_values_are_kept_in_the_run_and_an_interrupted_pass_resumes(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = list(iter_texts([run]))
    first = p_true_values([run], texts, CheckPassOptions())
    stored = json.loads((run / CHECK_PASS_FILE).read_text())
    assert len(stored["p_true"]) == len(texts)
    # As if interrupted after some batches: only the missing answers are asked again, to the same values.
    kept = dict(list(stored["p_true"].items())[: len(texts) // 2])
    (run / CHECK_PASS_FILE).write_text(json.dumps({**stored, "p_true": kept}))
    asked: list[int] = []
    original = _Checker.p_true
    monkeypatch.setattr(_Checker, "p_true", lambda self, pairs: asked.append(len(pairs)) or original(self, pairs))
    again = p_true_values([run], texts, CheckPassOptions())
    assert sum(asked) == len(texts) - len(kept)
    np.testing.assert_allclose(again, first, atol=1e-6)
    # Everything cached: the model is not even loaded.
    monkeypatch.setattr(_Checker, "engine", lambda self: pytest.fail("the model was loaded"))
    np.testing.assert_array_equal(p_true_values([run], texts[::-1], CheckPassOptions()), again[::-1])


@pytest.mark.parametrize("changed", ["check_prompt", "model_sha256", "dtype"])
def test_values_of_another_check_prompt_or_model_are_not_reused(run: Path, changed: str) -> None:
    texts = list(iter_texts([run]))
    p_true_values([run], texts, CheckPassOptions())
    stored = json.loads((run / CHECK_PASS_FILE).read_text())
    stored = {**stored, changed: "another", "p_true": {cache_key(t): 2.0 for t in texts}}
    (run / CHECK_PASS_FILE).write_text(json.dumps(stored))
    assert (p_true_values([run], texts, CheckPassOptions()) <= 1.0).all()


def test_a_damaged_cache_is_named(run: Path) -> None:
    (run / CHECK_PASS_FILE).write_text("[1, 2]")
    with pytest.raises(SystemExit, match=r"check-pass\.json is damaged"):
        p_true_values([run], list(iter_texts([run])), CheckPassOptions())


def test_a_data_file_changed_since_the_run_is_refused(run: Path) -> None:
    settings = json.loads((run / RUN_FILE).read_text())
    settings["data"][0]["sha256"] = "0" * 64
    (run / RUN_FILE).write_text(json.dumps(settings))
    with pytest.raises(SystemExit, match="changed since the run was generated"):
        p_true_values([run], list(iter_texts([run])), CheckPassOptions())


def test_a_moved_data_file_is_named(run: Path, tmp_path: Path) -> None:
    text = next(iter(iter_texts([run])))
    moved = replace(text, meta={**text.meta, "file": str(tmp_path / "x")})
    with pytest.raises(SystemExit, match="cannot be read"):
        question_of(moved)
