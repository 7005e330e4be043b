"""Linked copies of runs with the per-token prompt-overlap statistic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from transformers import PreTrainedTokenizerBase

from app.engine.loading import LoadedModel
from benchmarks.prompt_overlap_runs import PROMPT_OVERLAP, TokenPieces, annotate_run, main, prompt_overlap
from training.cli import main as training_main
from training.runs import completed_shards, iter_texts


class _Pieces:
    """A tokenizer stand-in: token id -> its text."""

    def __init__(self, texts: dict[int, str]) -> None:
        self.texts = texts

    def decode(self, ids: list[int]) -> str:
        return "".join(self.texts[i] for i in ids)


def test_a_token_overlaps_when_its_stripped_case_folded_text_is_a_prompt_tokens() -> None:
    texts = {1: " Paris", 2: "paris", 3: " Lyon", 4: ".", 5: " is", 6: "Is", 7: "\n"}
    pieces = TokenPieces(cast(PreTrainedTokenizerBase, _Pieces(texts)))
    prompt = [5, 1, 4]  # " is", " Paris", "."
    # "paris" matches " Paris" (space and case aside), "Is" matches " is"; " Lyon" and a bare newline do not.
    assert prompt_overlap([2, 3, 6, 4, 7], prompt, pieces).tolist() == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert prompt_overlap([], prompt, pieces).dtype == np.float64


def test_copies_link_the_run_and_add_the_statistic(
    tiny_runs: dict[str, Path], tiny_loaded: LoadedModel, tmp_path: Path
) -> None:
    run = tiny_runs["dev"]
    before = sorted(p.name for shard in completed_shards(run) for p in shard.iterdir())
    pieces = TokenPieces(tiny_loaded.tokenizer)
    assert annotate_run(run, tmp_path, pieces, tiny_loaded.tokenizer) == len(completed_shards(run))
    copy = tmp_path / run.name
    for shard in completed_shards(copy):
        assert (shard / "attention.npy").is_symlink() and (shard / "texts.json").is_symlink()
    originals, copies = list(iter_texts([run])), list(iter_texts([copy]))
    assert [t.key for t in copies] == [t.key for t in originals]
    for original, copied in zip(originals, copies, strict=True):
        overlap = copied.stats[PROMPT_OVERLAP]
        assert len(overlap) == len(original) and set(overlap.tolist()) <= {0.0, 1.0}
        np.testing.assert_array_equal(copied.stats["logprob"], original.stats["logprob"])
    # The tiny model's answers are words of its vocabulary, and its prompts are full of them: some overlap.
    assert 0 < np.concatenate([t.stats[PROMPT_OVERLAP] for t in copies]).mean() < 1
    # The run itself is untouched, and a second pass has nothing left to do.
    assert sorted(p.name for shard in completed_shards(run) for p in shard.iterdir()) == before
    assert annotate_run(run, tmp_path, pieces, tiny_loaded.tokenizer) == 0


def test_the_copies_are_runs_lodo_can_fit_the_statistic_on(
    tiny_runs: dict[str, Path], tiny_artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["--out", str(tmp_path / "copies"), str(tiny_runs["train"]), str(tiny_runs["dev"])])
    assert capsys.readouterr().out.split() == [str(tmp_path / "copies" / name) for name in ("train", "dev")]
    train, dev = tmp_path / "copies" / "train", tmp_path / "copies" / "dev"
    out = tmp_path / "lodo"
    fit = ["--artifact", str(tiny_artifact), "--out", str(out), "--bootstrap", "20", "--extra-stats", PROMPT_OVERLAP]
    training_main(["lodo", str(train), "--test", str(dev), *fit])
    report = json.loads((out / "lodo.json").read_text())
    assert report["configuration"]["extra_stats"] == [PROMPT_OVERLAP]
    assert set(report["datasets"]) == {"squad", "mmlu"}


def test_two_runs_with_one_folder_name_are_refused(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="share a folder name"):
        main(["--out", str(tmp_path), str(tiny_runs["dev"]), str(tiny_runs["dev"])])
