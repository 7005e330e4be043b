"""Scores that need a check pass (P(True)) on stored answers, computed as the server computes them.

The server asks the model about its own answer after generating it (app/serving/check_pass.py): the
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
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import ValidationError
from tqdm import tqdm

from app.files import write_text_atomic
from app.hashing import file_sha256
from app.uncertainty.artifact import TadArtifact
from app.uncertainty.methods import REGISTRY
from training.data import QARecord
from training.runs import CHECK_PASS_FILE, TextTrace, iter_texts, read_run_settings
from training.tasks import PromptStyle, build_messages

if TYPE_CHECKING:
    from app.engine.engine import Engine

logger = logging.getLogger(__name__)

CHECKED = "p_true"  # the one check-pass method there is (REGISTRY's needs_check_pass)


@dataclass(frozen=True)
class CheckPassOptions:
    """How the model is loaded for the check pass (its spec and dtype come from the runs)."""

    device: str = "auto"
    cache_dir: Path | None = None
    # Check prompts prefilled together: its own setting, not `--batch-size` (the answers decoding at once); the
    # build times the docs give were measured at 8.
    batch_size: int = 8


def check_prompt_version() -> str:
    """A digest of the check prompt and the token read: cached values of another prompt are not reused."""
    from app.serving.check_pass import CHECK_PROMPT, YES

    return hashlib.sha256(f"{CHECK_PROMPT}|{YES}".encode()).hexdigest()[:16]


def check_pass_methods(artifact: TadArtifact) -> list[str]:
    """The check-pass methods an artifact decides with or holds thresholds for (evaluate and calibrate score
    them too; other artifacts are not made to wait for a second pass over every answer)."""
    held = {method.value for method in artifact.manifest.thresholds} | {artifact.decision_method.value}
    return [name for name in sorted(held) if REGISTRY[name].needs_check_pass]


@cache
def _lines(path: str) -> tuple[bytes, ...]:
    """The file's lines as generation numbered them (split on newline bytes only, as `read_records` reads)."""
    return tuple(Path(path).read_bytes().split(b"\n"))


@cache
def _sha256(path: str) -> str:
    """The data file's digest as `generate` recorded it in run.json (once per file)."""
    return file_sha256(Path(path))


def check_data_unchanged(settings: dict[str, Any], texts: Sequence[TextTrace]) -> None:
    """Refuse data files that changed since the run was generated (run.json holds their sha256): a question
    rebuilt from an edited file is not the one the answer was given to."""
    recorded = {str(Path(str(entry.get("path"))).resolve()): entry.get("sha256") for entry in settings.get("data", [])}
    for path in sorted({str(text.meta.get("file", "")) for text in texts}):
        if not Path(path).is_file():
            raise SystemExit(
                f"{path} cannot be read, and P(True) asks the model about the questions the run's answers were "
                "given to: give the data file at the path the run was generated from"
            )
        if recorded.get(str(Path(path).resolve()), _sha256(path)) != _sha256(path):
            raise SystemExit(f"{path} changed since the run was generated: its questions cannot be rebuilt")


def question_of(text: TextTrace) -> str:
    """The user turn the answer was generated for, rebuilt from the run's data file: what the server reads as
    the question (the last user turn)."""
    if text.prompt_style is PromptStyle.FEW_SHOT:
        raise SystemExit("a few-shot answer has no user turn to quote: P(True) needs chat- or task-style answers")
    path, line = str(text.meta.get("file", "")), int(text.meta.get("line", 0))
    where = f"answer {text.key}: {path} line {line}"
    try:
        lines = _lines(path)
    except OSError:
        lines = ()
    if not 1 <= line <= len(lines):
        raise SystemExit(f"{where} cannot be read: give the data file the run was generated from")
    try:
        record = QARecord.model_validate_json(lines[line - 1])
    except ValidationError:
        raise SystemExit(f"{where} is not a valid record any more: the data file changed") from None
    if record.id != text.meta.get("id", record.id):
        raise SystemExit(f"{where} holds record {record.id}: the data file changed")
    return build_messages(record, text.prompt_style)[-1]["content"]


def _identity(settings: dict[str, Any]) -> dict[str, str]:
    """What a cached value depends on besides the answer: the check prompt, the model and its dtype."""
    return {
        "check_prompt": check_prompt_version(),
        "model_sha256": str(settings["model_sha256"]),
        "dtype": str(settings.get("dtype", "auto")),
    }


def _read_cache(run: Path, identity: dict[str, str]) -> dict[str, float]:
    path = run / CHECK_PASS_FILE
    if not path.is_file():
        return {}
    try:
        stored = json.loads(path.read_text())
        if {key: stored.get(key) for key in identity} != identity:
            logger.warning("%s was computed with another check prompt or model: computing it again", path)
            return {}
        return {str(key): float(value) for key, value in stored[CHECKED].items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        raise SystemExit(f"{path} is damaged: delete it and the check is asked again") from None


def _write_cache(run: Path, identity: dict[str, str], values: dict[str, float]) -> None:
    write_text_atomic(run / CHECK_PASS_FILE, json.dumps({**identity, CHECKED: values}, indent=0) + "\n")


def cache_key(text: TextTrace) -> str:
    return "|".join(text.answer_key)


class _Checker:
    """One run's model (its spec, dtype and capture settings from run.json), loaded at the first answer that
    needs it."""

    def __init__(self, settings: dict[str, Any], options: CheckPassOptions) -> None:
        self.settings, self.options = settings, options
        self._engine: Engine | None = None

    def engine(self) -> Engine:
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
        from app.serving.check_pass import check_pass, p_true_of

        engine = self.engine()
        return [p_true_of(trace) for trace in engine.score([check_pass(engine, q, a) for q, a in pairs])]


def p_true_values(runs: Sequence[Path], texts: Sequence[TextTrace], options: CheckPassOptions) -> np.ndarray:
    """P(True) of every text (texts of `runs`, in any order), from the runs' caches, asking each run's model
    for the answers not in them (shortest check prompts batched together, the cache written after each
    batch). Runs of one model and dtype share the loaded model."""
    merged: dict[str, float] = {}
    checkers: dict[tuple[str, str], _Checker] = {}
    for run in map(Path, runs):
        settings = read_run_settings(run)
        identity = _identity(settings)
        values = _read_cache(run, identity)
        missing = [text for text in iter_texts([run]) if cache_key(text) not in values]
        if missing:
            check_data_unchanged(settings, missing)
            questions = [question_of(text) for text in missing]  # every record readable before the model loads
            checker = checkers.setdefault((identity["model_sha256"], identity["dtype"]), _Checker(settings, options))
            answers = [str(text.meta["answer"]) for text in missing]
            order = sorted(range(len(missing)), key=lambda i: len(questions[i]) + len(answers[i]))
            with tqdm(total=len(order), desc=f"P(True) check pass ({run.name})", unit="answer") as progress:
                for start in range(0, len(order), options.batch_size):
                    chunk = order[start : start + options.batch_size]
                    asked = checker.p_true([(questions[i], answers[i]) for i in chunk])
                    for i, value in zip(chunk, asked, strict=True):
                        values[cache_key(missing[i])] = value
                    _write_cache(run, identity, values)
                    progress.update(len(chunk))
        merged.update(values)
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
