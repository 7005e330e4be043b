"""`python -m training rescore`: a run's stored answers scored again with the current targets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from training.cli import main
from training.commands.generate import GenerateOptions, run_generate
from training.runs import RUN_FILE, check_run_folders, completed_shards, iter_texts
from training.targets import TARGETS_VERSION


def _as_made_with_old_targets(run: Path) -> str:
    """Mark the run as scored with version 1 and spoil one stored target; the spoiled answer's key."""
    settings = json.loads((run / RUN_FILE).read_text())
    settings.pop("targets", None)
    (run / RUN_FILE).write_text(json.dumps(settings))
    texts_file = completed_shards(run)[0] / "texts.json"
    metas = json.loads(texts_file.read_text())
    metas[0]["target"] = -1.0  # no target is: rescoring must replace it
    texts_file.write_text(json.dumps(metas))
    return metas[0]["key"]


def test_a_run_with_old_targets_is_refused_until_rescored(tmp_path: Path, tiny_runs: dict[str, Path]) -> None:
    run = Path(shutil.copytree(tiny_runs["dev"], tmp_path / "dev"))
    expected = {text.meta["key"]: text.meta["target"] for text in iter_texts([tiny_runs["dev"]])}
    spoiled = _as_made_with_old_targets(run)
    with pytest.raises(SystemExit, match=r"targets version 1.*rescore"):
        check_run_folders([run])  # what every command reading runs calls first
    main(["rescore", str(run)])
    check_run_folders([run])
    rescored = {text.meta["key"]: text.meta["target"] for text in iter_texts([run])}
    assert rescored == expected and rescored[spoiled] == expected[spoiled]
    assert json.loads((run / RUN_FILE).read_text())["targets"] == TARGETS_VERSION
    before = [json.loads((shard / "texts.json").read_text()) for shard in completed_shards(run)]
    main(["rescore", str(run)])  # up to date: nothing to do
    assert [json.loads((shard / "texts.json").read_text()) for shard in completed_shards(run)] == before


def test_rescore_finds_moved_data_by_its_hash(tmp_path: Path, tiny_runs: dict[str, Path]) -> None:
    run = Path(shutil.copytree(tiny_runs["dev"], tmp_path / "dev"))
    _as_made_with_old_targets(run)
    settings = json.loads((run / RUN_FILE).read_text())
    moved = []
    for entry in settings["data"]:
        copy = tmp_path / "moved" / Path(entry["path"]).name
        copy.parent.mkdir(exist_ok=True)
        shutil.copy(entry["path"], copy)
        entry["path"] = str(tmp_path / "gone" / Path(entry["path"]).name)
        moved.append(str(copy))
    (run / RUN_FILE).write_text(json.dumps(settings))
    with pytest.raises(SystemExit, match="pass the original file with --data"):
        main(["rescore", str(run)])
    main(["rescore", str(run), "--data", *moved])
    check_run_folders([run])


def test_extending_a_run_with_old_targets_asks_for_a_rescore(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]]
) -> None:
    def options(limit: int) -> GenerateOptions:
        return GenerateOptions(
            data=tiny_data["dev"][:1], out=tmp_path / "run", model=str(tiny_model_dir), limit=limit, shard_size=2
        )

    run = run_generate(options(2))
    _as_made_with_old_targets(run)
    with pytest.raises(SystemExit, match="rescore them before extending"):
        run_generate(options(2))
    main(["rescore", str(run)])
    run_generate(options(2))  # resumes: nothing left to do
