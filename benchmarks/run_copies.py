"""Linked copies of generation runs with some of their arrays replaced or added (what the run-copy studies share).

A copy shard links every file of the original it does not replace (nothing is duplicated), is
written under a temporary name and renamed into place when complete, so a study that stops is run
again and goes on with the shards it has not written.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from training.commands.rescore import run_data_files
from training.data import QARecord, read_records
from training.runs import completed_shards, read_run_settings
from training.tasks import PromptStyle


def run_records(run: Path, settings: Mapping[str, Any]) -> dict[str, QARecord]:
    """The run's records by answer key (`dataset/id`), from its data files (found by their sha256)."""
    files = run_data_files(run, dict(settings), ())
    return {f"{item.dataset}/{item.record.id}": item.record for item in read_records(files)}


def chat_run_settings(run: Path) -> dict[str, Any]:
    """The run's settings; a few-shot run is refused (its prompts are not chat messages to rebuild)."""
    settings = read_run_settings(run)
    if settings.get("prompt_style") == PromptStyle.FEW_SHOT.value:
        raise SystemExit(f"{run} is a few-shot run: only chat-prompt runs (task or bare) can be copied")
    return settings


def copy_done(final: Path) -> bool:
    return (final / "texts.json").exists()


def write_linked_shard(shard: Path, final: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write `final`: `arrays` (file name -> array) saved, every other file of `shard` linked."""
    staging = final.with_name(final.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    for file in shard.iterdir():
        if file.name not in arrays:
            os.symlink(file.resolve(), staging / file.name)
    for name, array in arrays.items():
        np.save(staging / name, array)
    os.replace(staging, final)


def check_distinct_names(runs: list[Path]) -> None:
    names = [run.name for run in runs]
    if len(set(names)) < len(names):
        raise SystemExit("two runs share a folder name: their copies would collide under --out")


def runs_model(runs: Sequence[Path]) -> str:
    """The one model the runs were made with; refuses runs whose copies would collide or that mix models."""
    check_distinct_names(list(runs))
    models = {str(read_run_settings(run)["model"]) for run in runs}
    if len(models) > 1:
        raise SystemExit(f"the runs were made with {len(models)} models; give one model's runs at a time")
    return models.pop()


def pending_shards(run: Path, target: Path, desc: str) -> Iterator[tuple[Path, Path]]:
    """(shard, where its copy goes) for each completed shard of `run` whose copy under `target` is not
    written yet, with a progress bar: what makes a copy study resumable."""
    for shard in tqdm(completed_shards(run), desc=f"{desc} {run.name}", unit="shard"):
        final = target / shard.parent.name / shard.name
        if not copy_done(final):
            yield shard, final
