"""Runs made when the chat prompt style was called "bare" read as chat: with runs made since, they group and
deduplicate as one style."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from training.fit.texts import load_runs
from training.runs import RUN_FILE, completed_shards, iter_texts
from training.tasks import PromptStyle


def restyled(run: Path, out: Path, style: str, shards: Sequence[int] | None = None) -> Path:
    """A copy of `run` (its shards `shards`, all by default) whose run.json and texts say prompt style `style`:
    "bare" as runs made before the rename store it, "chat" as runs made since."""
    out.mkdir(parents=True)
    settings = json.loads((run / RUN_FILE).read_text())
    (out / RUN_FILE).write_text(json.dumps({**settings, "prompt_style": style}))
    for index, shard in enumerate(completed_shards(run)):
        if shards is None or index in shards:
            copy = Path(shutil.copytree(shard, out / "shards" / shard.name))
            metas = json.loads((copy / "texts.json").read_text())
            (copy / "texts.json").write_text(json.dumps([{**meta, "prompt_style": style} for meta in metas]))
    return out


def test_a_run_made_before_the_rename_reads_as_chat(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    old = restyled(tiny_runs["dev"], tmp_path / "old", "bare")
    texts = list(iter_texts([old]))
    assert texts and all(t.meta["prompt_style"] == "bare" for t in texts)  # as stored
    assert {t.prompt_style for t in texts} == {PromptStyle.CHAT}
    assert {t.group for t in texts} == {"squad/chat", "mmlu/chat"}
    assert {t.answer_key[1] for t in texts} == {"chat"}


def test_old_and_new_chat_runs_are_one_style_to_fit(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    old = restyled(tiny_runs["train"], tmp_path / "old", "bare", shards=[0, 1])
    new = restyled(tiny_runs["train"], tmp_path / "new", "chat", shards=[2])
    texts, _, _ = load_runs([old, new], None)
    assert len(texts) == len(list(iter_texts([tiny_runs["train"]])))
    assert {t.group for t in texts} == {"squad/chat", "mmlu/chat"}  # both datasets span the two runs


def test_the_same_answers_in_an_old_and_a_new_run_are_one_answer_twice(
    tiny_runs: dict[str, Path], tmp_path: Path
) -> None:
    old = restyled(tiny_runs["train"], tmp_path / "old", "bare")
    new = restyled(tiny_runs["train"], tmp_path / "new", "chat")
    with pytest.raises(SystemExit, match="more than once"):
        load_runs([old, new], None)


def test_runs_generated_in_two_dtypes_are_not_fitted_together(tiny_runs: dict[str, Path], tmp_path: Path) -> None:
    """The artifact records one dtype, and the server runs the model in it."""
    other = Path(shutil.copytree(tiny_runs["dev"], tmp_path / "bf16"))
    settings = json.loads((other / RUN_FILE).read_text())
    (other / RUN_FILE).write_text(json.dumps({**settings, "dtype": "bfloat16"}))
    with pytest.raises(SystemExit, match=r"generated in bfloat16, .* in float32: fit runs of one dtype"):
        load_runs([tiny_runs["train"], other], None)


def test_a_shard_is_on_disk_before_its_name_says_it_is_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a crash, a shard folder under its final name (which a rerun skips) must hold its arrays."""
    from tests.app.test_files import record_disk_order
    from training.runs import write_shard

    events = record_disk_order(monkeypatch)
    final = write_shard(tmp_path, 0, [], (2, 2, 3))
    renamed = events.index(("rename", str(final)))
    synced_before = {Path(path).name for kind, path in events[:renamed] if kind == "sync"}
    assert {"texts.json", "attention.npy", "offsets.npy", "token_ids.npy"} <= synced_before
    assert events[renamed + 1 :] == [("sync", str(final.parent))]
