"""The on-disk format of a generation run, written by `generate` and read by fit/evaluate/calibrate.

    RUN_DIR/run.json                 settings the run was made with (checked on resume)
    RUN_DIR/shards/shard-00000/      one folder per shard, renamed into place when complete:
        texts.json                   per text: key, dataset, task, id, file, line, answer, target, ...
        offsets.npy                  [texts + 1] token offsets into the arrays below
        token_ids.npy                [tokens] int32
        stat-<name>.npy              [tokens] float64, one per token statistic (app/engine/token_stats.py),
                                     e.g. stat-logprob.npy (raw-logit log-probabilities), stat-entropy.npy
        attention.npy                [tokens, layers, heads, lags + 1] float32 step rows (memory-mapped on read)
    RUN_DIR/check-pass.json          P(True) of answers, once a command has asked the model about them
                                     (training/check_pass_scores.py; keyed by answer key)

A shard folder exists only when all its files are written (it is written under a
temporary name and renamed), so an interrupted run never leaves a half shard behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from numpy.typing import ArrayLike
from pydantic import ValidationError

from app.files import sync_folder, sync_tree
from app.identity import ModelIdentity
from app.uncertainty.trace import TokenTrace
from training.tasks import PromptStyle

logger = logging.getLogger(__name__)

SHARDS = "shards"
RUN_FILE = "run.json"
# How many shards `generate` planned (runs made before it was written have none: not checked).
PLAN_FILE = "plan.json"
# A run folder's own entries, besides the `.tmp` files its processes write them through.
CHECK_PASS_FILE = "check-pass.json"
RUN_ENTRIES = frozenset({RUN_FILE, PLAN_FILE, SHARDS, CHECK_PASS_FILE})
# What every command reads of a text's entry in texts.json.
REQUIRED_META = ("key", "dataset", "target")
STAT_PREFIX = "stat-"
REQUIRED_STATS = ("logprob", "entropy")

T = TypeVar("T")


@dataclass(frozen=True)
class TextTrace(TokenTrace):
    """One generated answer with its per-token statistics (a `TokenTrace`) and what the run knows of it."""

    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return str(self.meta["key"])

    @property
    def rows(self) -> np.ndarray:
        """The step rows: a run generates with capture, so every answer in it has them."""
        if self.attention is None:
            raise ValueError(f"answer {self.key} has no attention rows")
        return self.attention

    @property
    def prompt_style(self) -> PromptStyle:
        """How the record was asked (runs made before styles were recorded: task). Runs made before the chat
        style's rename say "bare": they read as chat, so that old and new runs group and deduplicate together."""
        return PromptStyle(self.meta.get("prompt_style", PromptStyle.TASK.value))

    @property
    def answer_key(self) -> tuple[str, str]:
        """(record key, prompt style): one record asked in two prompt styles is two answers."""
        return self.key, self.prompt_style.value

    @property
    def group(self) -> str:
        """Dataset/prompt style: the groups fit ranks within (training/groups.py)."""
        return f"{self.dataset}/{self.prompt_style.value}"

    @property
    def target(self) -> float:
        return float(self.meta["target"])

    @property
    def dataset(self) -> str:
        return str(self.meta["dataset"])

    def token_trace(self, n_lags: int | None = None) -> TokenTrace:
        """The trace the uncertainty methods read (step rows cut to keys 0..`n_lags` back)."""
        attention = np.asarray(self.rows if n_lags is None else self.rows[..., : n_lags + 1])
        return TokenTrace(token_ids=tuple(int(t) for t in self.token_ids), stats=self.stats, attention=attention)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def shard_path(run_dir: Path, index: int) -> Path:
    return run_dir / SHARDS / shard_name(index)


def shard_done(run_dir: Path, index: int) -> bool:
    return (shard_path(run_dir, index) / "texts.json").is_file()


def write_shard(run_dir: Path, index: int, texts: Sequence[TextTrace], attention_shape: tuple[int, int, int]) -> Path:
    """Write a complete shard atomically (temporary folder, then rename)."""
    final = shard_path(run_dir, index)
    staging = final.with_name(final.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    lengths = [len(text) for text in texts]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def joined(arrays: Sequence[ArrayLike], dtype: type, shape: tuple[int, ...] = ()) -> np.ndarray:
        return np.concatenate(arrays).astype(dtype) if arrays else np.zeros((0, *shape), dtype=dtype)

    np.save(staging / "offsets.npy", offsets)
    np.save(staging / "token_ids.npy", joined([t.token_ids for t in texts], np.int32))
    for name in texts[0].stats if texts else ():
        np.save(staging / f"{STAT_PREFIX}{name}.npy", joined([t.stats[name] for t in texts], np.float64))
    attention = [t.rows for t in texts if len(t)]
    np.save(staging / "attention.npy", joined(attention, np.float32, attention_shape))
    (staging / "texts.json").write_text(json.dumps([t.meta for t in texts], ensure_ascii=False))
    # On disk before the rename: a shard named done (its texts.json) after a crash must hold its arrays.
    sync_tree(staging)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    sync_folder(final.parent)
    return final


def read_shard(path: Path) -> list[TextTrace]:
    """A completed shard's texts; a damaged one (a file cut short, an entry missing what every command
    reads) is named with what to do, not met later as a numpy or key error."""
    return _undamaged(path, _read_shard)


def read_shard_metas(path: Path) -> list[dict[str, Any]]:
    """A completed shard's entries of texts.json alone, checked as `read_shard` checks them."""
    return _undamaged(path, _read_metas)


def _undamaged(path: Path, read: Callable[[Path], T]) -> T:
    try:
        return read(path)
    except PermissionError:
        raise  # not damage: the files are there, this user cannot read them
    except (OSError, EOFError, ValueError, KeyError, TypeError, IndexError) as error:  # EOFError: an empty .npy
        raise SystemExit(
            f"shard {path} is damaged ({type(error).__name__}: {error}): move the folder aside and rerun the "
            "same generate command, which makes that shard again"
        ) from error


def _read_metas(path: Path) -> list[dict[str, Any]]:
    metas = json.loads((path / "texts.json").read_text())
    if not isinstance(metas, list):
        raise ValueError("texts.json is not a list")
    for meta in metas:
        missing = [name for name in REQUIRED_META if not isinstance(meta, dict) or name not in meta]
        if missing:
            raise KeyError(f"an entry of texts.json has no {', '.join(missing)}")
    return metas


def _read_shard(path: Path) -> list[TextTrace]:
    metas = _read_metas(path)
    offsets = np.load(path / "offsets.npy")
    token_ids = np.load(path / "token_ids.npy")
    stats = {
        file.name.removeprefix(STAT_PREFIX).removesuffix(".npy"): np.load(file)
        for file in sorted(path.glob(f"{STAT_PREFIX}*.npy"))
    }
    missing = [name for name in REQUIRED_STATS if name not in stats]
    if metas and missing:  # what every method reads (`.logprobs`, `.entropies`); a shard of no answers has none
        raise KeyError(f"no {', '.join(f'{STAT_PREFIX}{name}.npy' for name in missing)}")
    attention = np.load(path / "attention.npy", mmap_mode="r")
    texts = []
    for i, meta in enumerate(metas):
        start, end = int(offsets[i]), int(offsets[i + 1])
        texts.append(
            TextTrace(
                meta=meta,
                token_ids=token_ids[start:end],
                stats={name: values[start:end] for name, values in stats.items()},
                attention=attention[start:end],
            )
        )
    return texts


def check_no_duplicates(keys: Iterable[tuple[str, str]]) -> None:
    """Refuse an answer (record key, prompt style) present twice (the same run given twice, or overlapping
    runs): it would weigh double in a fit (and, split by text, sit on both sides of a fold), count twice in
    an evaluation, and give a calibration's guarantee twice the answers it has."""
    seen: set[tuple[str, str]] = set()
    duplicates: list[str] = []
    for key in keys:
        if key in seen:
            duplicates.append(f"{key[0]} ({key[1]})")
        seen.add(key)
    if duplicates:
        raise SystemExit(
            f"{len(duplicates)} answers appear more than once in the runs (e.g. {duplicates[0]}): "
            "is a run given twice, or do runs overlap?"
        )


def read_run_settings(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a generation run (no {RUN_FILE})")
    try:
        settings = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        # The decoder's message does not name the file.
        raise SystemExit(f"{path} is corrupt ({error.msg} at line {error.lineno}): regenerate the run") from None
    # What every command reads: checked here so that a damaged file is named, not met as a KeyError later.
    problem = None
    if not isinstance(settings, dict):
        problem = "not a JSON object"
    elif not isinstance(settings.get("n_lags"), int) or isinstance(settings["n_lags"], bool) or settings["n_lags"] < 0:
        problem = "no whole number of attention lags (n_lags)"
    elif not isinstance(settings.get("model_sha256"), str) or not _is_identity(settings.get("identity")):
        problem = "no model identity (model_sha256, identity)"
    if problem is not None:
        raise SystemExit(f"{path} is not a run's settings ({problem}): regenerate the run")
    return settings


def _is_identity(value: object) -> bool:
    try:
        ModelIdentity.model_validate(value)
    except ValidationError:
        return False
    return True


def run_dtype(settings: dict[str, Any]) -> str:
    """The dtype a run's answers were generated in (runs made before it was recorded: float32)."""
    return str(settings.get("dtype") or "float32")


def run_targets_version(settings: dict[str, Any]) -> int:
    """The targets version a run's answers were scored with (runs made before versions were recorded: 1)."""
    version = settings.get("targets", 1)
    return version if isinstance(version, int) and not isinstance(version, bool) else 1


def check_run_folders(runs: Sequence[Path]) -> None:
    """Refuse paths that are not generation runs (missing, a file, no run.json or a damaged one): read as
    runs, they would hold no texts and a command would report on nothing. Refuse runs scored with other
    targets than the code's: fitted or evaluated together, answers would be judged by two rules."""
    from training.targets import RESCORE_HINT, TARGETS_VERSION

    for run in runs:
        if not Path(run).is_dir():
            raise SystemExit(f"run {run} is not a folder" if Path(run).exists() else f"run {run} does not exist")
        if not (Path(run) / RUN_FILE).is_file():
            raise SystemExit(f"{run} is not a generation run (no {RUN_FILE})")
        version = run_targets_version(read_run_settings(Path(run)))
        if version != TARGETS_VERSION:
            raise SystemExit(
                f"{run}'s answers were scored with targets version {version}, this code's are version "
                f"{TARGETS_VERSION}: {RESCORE_HINT}"
            )


def completed_shards(run_dir: Path) -> list[Path]:
    folder = run_dir / SHARDS
    if not folder.is_dir():
        return []
    # A ".partial" folder is a shard whose writer was killed before the final rename.
    return sorted(
        p for p in folder.iterdir() if p.is_dir() and not p.name.endswith(".partial") and (p / "texts.json").is_file()
    )


def write_plan(run_dir: Path, shards: int, rank: int = 0) -> None:
    """Record how many shards the run will hold (every data-parallel process plans the same)."""
    staging = run_dir / f"{PLAN_FILE}.{rank}.tmp"
    staging.write_text(json.dumps({"shards": shards}) + "\n")
    staging.replace(run_dir / PLAN_FILE)


def planned_shards(run_dir: Path) -> int | None:
    path = run_dir / PLAN_FILE
    try:
        return int(json.loads(path.read_text())["shards"]) if path.is_file() else None
    except (ValueError, KeyError, TypeError):
        return None


def record_keys(run_dirs: Sequence[Path]) -> set[str]:
    """The record keys of every answer in the runs' completed shards, read from their texts.json only."""
    shards = [shard for run in run_dirs for shard in completed_shards(Path(run))]
    return {str(meta["key"]) for shard in shards for meta in read_shard_metas(shard)}


def iter_texts(run_dirs: Sequence[Path]) -> Iterator[TextTrace]:
    """Every text of every completed shard of the runs (data-parallel shards included); a run whose
    `generate` has not finished is used as it is, with a warning naming what it lacks."""
    for run_dir in run_dirs:
        shards = completed_shards(Path(run_dir))
        planned = planned_shards(Path(run_dir))
        if planned is not None and len(shards) < planned:
            logger.warning(
                "run %s holds %d of its %d shards: its generate has not finished (rerun it to complete the "
                "run); using the answers it has",
                run_dir,
                len(shards),
                planned,
            )
        for shard in shards:
            yield from read_shard(shard)
