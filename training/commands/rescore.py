"""Score a run's stored answers again with the current targets (training/targets.py), without generating.

Generation is the expensive part of a run; its answers' texts are stored, so a change of the targets
(`TARGETS_VERSION`) only needs each answer scored again against its record. Each shard's texts.json is
rewritten atomically, and run.json records the new version last: an interrupted rescore is run again.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from app.hashing import file_sha256
from training.data import QARecord, read_records
from training.runs import RUN_FILE, completed_shards, read_run_settings, run_targets_version
from training.targets import TARGETS_VERSION
from training.tasks import score_answer

logger = logging.getLogger(__name__)


def run_data_files(run: Path, settings: dict[str, Any], extra: Sequence[Path]) -> list[Path]:
    """The run's data files, each found by its sha256: at its recorded path, else among `extra`."""
    by_hash: dict[str, Path] = {}
    for path in extra:
        if not path.is_file():
            raise SystemExit(f"--data {path} is not a file")
        by_hash.setdefault(file_sha256(path), path)
    found = []
    for entry in settings.get("data", []):
        recorded, digest = Path(entry["path"]), entry["sha256"]
        if recorded.is_file() and file_sha256(recorded) == digest:
            found.append(recorded)
        elif digest in by_hash:
            found.append(by_hash[digest])
        else:
            raise SystemExit(
                f"{run} was generated from {recorded} (sha256 {digest[:12]}...), which is not there or has changed: "
                "pass the original file with --data"
            )
    return found


def rescore_run(run: Path, extra_data: Sequence[Path] = ()) -> tuple[int, int]:
    """Rescore every answer of `run` in place; (answers, targets changed)."""
    settings = read_run_settings(run)
    version = run_targets_version(settings)
    if version == TARGETS_VERSION:
        logger.info("%s: targets are already version %d", run, TARGETS_VERSION)
        return 0, 0
    if version > TARGETS_VERSION:
        raise SystemExit(f"{run} was scored with targets version {version}, newer than this code's {TARGETS_VERSION}")
    files = run_data_files(run, settings, extra_data)
    records: dict[str, QARecord] = {f"{item.dataset}/{item.record.id}": item.record for item in read_records(files)}
    shards = completed_shards(run)
    answers = changed = 0
    for shard in tqdm(shards, desc=f"rescore {run.name}", unit="shard"):
        texts_file = shard / "texts.json"
        metas = json.loads(texts_file.read_text())
        for meta in metas:
            record = records.get(meta["key"])
            if record is None:
                raise SystemExit(f"{shard}: answer {meta['key']} has no record in the run's data files")
            target = score_answer(meta["answer"], record)
            changed += target != meta["target"]
            meta["target"] = target
            answers += 1
        staging = texts_file.with_name("texts.json.tmp")
        staging.write_text(json.dumps(metas, ensure_ascii=False))
        os.replace(staging, texts_file)
    settings["targets"] = TARGETS_VERSION
    staging = run / f"{RUN_FILE}.tmp"
    staging.write_text(json.dumps(settings, indent=2) + "\n")
    os.replace(staging, run / RUN_FILE)
    logger.info(
        "%s: %d answers rescored, %d targets changed (version %d -> %d)",
        run,
        answers,
        changed,
        version,
        TARGETS_VERSION,
    )
    return answers, changed
