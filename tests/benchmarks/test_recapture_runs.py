"""Runs' attention rows captured again by teacher forcing, with more lags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.engine.engine import Engine
from app.engine.loading import LoadedModel
from benchmarks.recapture_runs import main, recapture_run
from tests.conftest import N_LAGS
from training.commands.fit import load_runs
from training.runs import completed_shards, iter_texts


def test_copies_hold_more_lags_and_reproduce_the_stored_ones(
    tiny_runs: dict[str, Path], tiny_loaded: LoadedModel, tmp_path: Path
) -> None:
    run, lags = tiny_runs["dev"], N_LAGS + 2
    differences = recapture_run(run, tmp_path, Engine(tiny_loaded, n_lags=lags))
    copy = tmp_path / run.name
    assert len(differences) == len(completed_shards(run)) and max(differences) < 1e-5
    assert json.loads((copy / "run.json").read_text())["n_lags"] == lags
    for shard in completed_shards(copy):
        assert (shard / "token_ids.npy").is_symlink() and not (shard / "attention.npy").is_symlink()
    originals, copies = list(iter_texts([run])), list(iter_texts([copy]))
    assert [t.key for t in copies] == [t.key for t in originals]
    for original, copied in zip(originals, copies, strict=True):
        assert copied.rows.shape == (*original.rows.shape[:3], lags + 1)
        np.testing.assert_allclose(copied.rows[..., : N_LAGS + 1], original.rows, atol=1e-5)
    # The extra slots are real attention weights, not padding: each key 0..lags back of a long enough answer.
    long = next(t for t in copies if len(t) > lags)
    assert np.all(long.rows[lags:, ..., lags] > 0)
    # fit reads the copies with the new number of lags; a second pass has nothing left to do.
    _, _, read_lags = load_runs([copy], None)
    assert read_lags == lags
    assert recapture_run(run, tmp_path, Engine(tiny_loaded, n_lags=lags)) == []


def test_the_command_refuses_no_lags_and_colliding_names(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="at least 1"):
        main(["--lags", "0", "--out", str(tmp_path), str(tiny_runs["dev"])])
    with pytest.raises(SystemExit, match="share a folder name"):
        main(["--lags", "3", "--out", str(tmp_path), str(tiny_runs["dev"]), str(tiny_runs["dev"])])
