"""Scores that need a check pass (P(True)) on stored answers, computed as the server computes them.

The server asks the model about its own answer after generating it (app/serving/self_check.py): the
question is the request's last user turn, the answer the generated text. A run stores the answer and
where its record is, so the same check can be asked afterwards: the record's user turn is rebuilt in
the run's prompt style. The model is loaded only when some answer has no value yet; values are kept in
the run folder (`check-pass.json`, written after every batch), so an interrupted pass resumes and a
second command on the same run asks nothing again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from app.uncertainty.artifact import TadArtifact
from app.uncertainty.methods import REGISTRY
from training.data import QARecord
from training.runs import CHECK_PASS_FILE, TextTrace, iter_texts, read_run_settings
from training.tasks import PromptStyle, build_messages

logger = logging.getLogger(__name__)

CHECKED = "p_true"  # the one check-pass method there is (REGISTRY's needs_check_pass)


@dataclass(frozen=True)
class CheckPassOptions:
    """How the model is loaded for the check pass (its spec and dtype come from the runs)."""

    device: str = "auto"
    cache_dir: Path | None = None
    batch_size: int = 8


def check_prompt_version() -> str:
    """A digest of the check prompt and the token read: cached values of another prompt are not reused."""
    from app.serving.self_check import CHECK_PROMPT, YES

    return hashlib.sha256(f"{CHECK_PROMPT}|{YES}".encode()).hexdigest()[:16]


def check_pass_methods(artifact: TadArtifact) -> list[str]:
    """The check-pass methods an artifact decides with or holds thresholds for (evaluate and calibrate score
    them too; other artifacts are not made to wait for a second pass over every answer)."""
    held = {method.value for method in artifact.manifest.thresholds} | {artifact.decision_method.value}
    return [name for name in sorted(held) if REGISTRY[name].needs_check_pass]


@cache
def _lines(path: str) -> tuple[str, ...]:
    return tuple(Path(path).read_text(encoding="utf-8").splitlines())


def question_of(text: TextTrace) -> str:
    """The user turn the answer was generated for, rebuilt from the run's data file: what the server reads as
    the question (the last user turn)."""
    if text.prompt_style is PromptStyle.FEW_SHOT:
        raise SystemExit("a few-shot run has no user turn to ask about: P(True) needs chat-style answers")
    path, line = str(text.meta.get("file", "")), int(text.meta.get("line", 0))
    try:
        raw = _lines(path)[line - 1]
    except (OSError, IndexError):
        raise SystemExit(
            f"answer {text.key}: its record ({path}, line {line}) cannot be read, and P(True) asks the model "
            "about the question: give the data file at the path the run was generated from"
        ) from None
    record = QARecord.model_validate_json(raw)
    if record.id != text.meta.get("id", record.id):
        raise SystemExit(f"answer {text.key}: {path} line {line} holds record {record.id}: the data file changed")
    return build_messages(record, text.prompt_style)[-1]["content"]


def _read_cache(run: Path, version: str) -> dict[str, float]:
    path = run / CHECK_PASS_FILE
    if not path.is_file():
        return {}
    stored: dict[str, Any] = json.loads(path.read_text())
    if stored.get("check_prompt") != version:
        logger.warning("%s was computed with another check prompt: computing it again", path)
        return {}
    return {str(key): float(value) for key, value in stored.get(CHECKED, {}).items()}


def _write_cache(run: Path, version: str, values: dict[str, float]) -> None:
    path = run / CHECK_PASS_FILE
    staging = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    staging.write_text(json.dumps({"check_prompt": version, CHECKED: values}, indent=0) + "\n")
    os.replace(staging, path)


def cache_key(text: TextTrace) -> str:
    return "|".join(text.answer_key)


class _Checker:
    """The model, loaded at the first answer that needs it (from the runs' own model spec and dtype)."""

    def __init__(self, settings: dict[str, Any], options: CheckPassOptions) -> None:
        self.settings, self.options = settings, options
        self._engine: Any = None

    def engine(self) -> Any:
        if self._engine is None:
            from app.engine.engine import Engine
            from app.engine.loading import load_model

            loaded = load_model(
                str(self.settings["model"]),
                device=self.options.device,
                dtype=str(self.settings.get("dtype", "auto")),
                cache_dir=self.options.cache_dir,
            )
            if loaded.identity.sha256 != self.settings["model_sha256"]:
                raise SystemExit(f"{self.settings['model']} is not the model the runs were generated with")
            self._engine = Engine(loaded, n_lags=int(self.settings["n_lags"]))
            if not self._engine.has_chat_template:
                raise SystemExit(f"{self.settings['model']} has no chat template: the check cannot be asked")
        return self._engine

    def p_true(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        from app.serving.self_check import check_pass, p_true_of_trace

        engine = self.engine()
        return [p_true_of_trace(trace) for trace in engine.score([check_pass(engine, q, a) for q, a in pairs])]


def p_true_values(runs: Sequence[Path], texts: Sequence[TextTrace], options: CheckPassOptions) -> np.ndarray:
    """P(True) of every text (texts of `runs`, in any order), from the runs' caches, asking the model for the
    answers not in them (shortest check prompts batched together, the cache written after each batch)."""
    version = check_prompt_version()
    cached = {Path(run): _read_cache(Path(run), version) for run in runs}
    checker = _Checker(read_run_settings(Path(runs[0])), options)
    for run, values in cached.items():
        missing = [text for text in iter_texts([run]) if cache_key(text) not in values]
        if not missing:
            continue
        questions = [question_of(text) for text in missing]  # every record readable before the model loads
        order = sorted(range(len(missing)), key=lambda i: len(questions[i]) + len(str(missing[i].meta["answer"])))
        with tqdm(total=len(order), desc=f"P(True) check pass ({run.name})", unit="answer") as progress:
            for start in range(0, len(order), options.batch_size):
                chunk = order[start : start + options.batch_size]
                pairs = [(questions[i], str(missing[i].meta["answer"])) for i in chunk]
                for i, value in zip(chunk, checker.p_true(pairs), strict=True):
                    values[cache_key(missing[i])] = value
                _write_cache(run, version, values)
                progress.update(len(chunk))
    merged = {key: value for values in cached.values() for key, value in values.items()}
    missing_keys = [cache_key(text) for text in texts if cache_key(text) not in merged]
    if missing_keys:
        raise SystemExit(f"{len(missing_keys)} answers are not in the given runs (first: {missing_keys[0]})")
    return np.array([merged[cache_key(text)] for text in texts], dtype=np.float64)


def check_pass_table(
    methods: Sequence[str], runs: Sequence[Path], texts: Sequence[TextTrace], options: CheckPassOptions
) -> dict[str, np.ndarray]:
    """Each named check-pass method's score of every text (the only one: P(True))."""
    unknown = [name for name in methods if name != CHECKED]
    if unknown:
        raise ValueError(f"no check pass computes {', '.join(unknown)}")
    return {CHECKED: p_true_values(runs, texts, options)} if methods else {}
