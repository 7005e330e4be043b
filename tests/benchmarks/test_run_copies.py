"""What the run-copy studies share: linked shards written atomically, and the runs they accept."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.run_copies import chat_run_settings, copy_done, run_records, write_linked_shard


def test_a_copy_links_what_it_keeps_and_saves_what_it_replaces(tmp_path: Path) -> None:
    shard = tmp_path / "run" / "shard-00000"
    shard.mkdir(parents=True)
    np.save(shard / "attention.npy", np.zeros(3))
    np.save(shard / "token_ids.npy", np.arange(3))
    (shard / "texts.json").write_text("[]")
    final = tmp_path / "copy" / "shard-00000"
    final.parent.mkdir()
    (final.parent / "shard-00000.partial").mkdir()  # left by a copy that was killed: replaced
    assert not copy_done(final)
    write_linked_shard(shard, final, {"attention.npy": np.ones(3), "stat-new.npy": np.full(3, 2.0)})
    assert copy_done(final) and not (final.parent / "shard-00000.partial").exists()
    assert (final / "token_ids.npy").is_symlink() and (final / "texts.json").is_symlink()
    assert not (final / "attention.npy").is_symlink()
    np.testing.assert_array_equal(np.load(final / "attention.npy"), np.ones(3))
    np.testing.assert_array_equal(np.load(final / "stat-new.npy"), np.full(3, 2.0))
    np.testing.assert_array_equal(np.load(shard / "attention.npy"), np.zeros(3))  # the original is untouched


def test_few_shot_runs_are_refused_and_chat_runs_give_their_records(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    run = tiny_runs["dev"]
    settings = chat_run_settings(run)
    records = run_records(run, settings)
    assert records and all(key.split("/")[0] in {"squad", "mmlu"} for key in records)
    few_shot = tmp_path / "few-shot"
    few_shot.mkdir()
    (few_shot / "run.json").write_text(json.dumps({**settings, "prompt_style": "few-shot"}))
    with pytest.raises(SystemExit, match="few-shot"):
        chat_run_settings(few_shot)
