"""Generation runs are written shard as it goes, resumes after an interruption, and never redoes finished shards."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import training.generation as generate_module
from app.identity import ModelIdentity
from training.generation import (
    LOADED_MODEL_SETTINGS,
    WIDE_BF16_PRODUCTS,
    GenerateOptions,
    run_generate,
    run_settings,
)
from training.runs import completed_shards, iter_texts


def _options(tiny_model_dir: Path, data: list[Path], out: Path, **changes: object) -> GenerateOptions:
    values = {
        "data": data,
        "out": out,
        "model": str(tiny_model_dir),
        "dtype": "float32",
        "n_lags": 3,
        "max_new_tokens": 6,
        "batch_size": 4,
        "shard_size": 8,
    }
    values.update(changes)
    return GenerateOptions(**values)  # type: ignore[arg-type]


def test_interrupted_run_resumes_without_redoing_shards(
    tmp_path: Path,
    tiny_model_dir: Path,
    tiny_data: dict[str, list[Path]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = tiny_data["dev"]  # 32 records -> 4 shards of 8
    out = tmp_path / "run"
    real_write = generate_module.write_shard
    written: list[int] = []

    def interrupted(run_dir: Path, index: int, texts, shape):
        if len(written) == 2:
            raise KeyboardInterrupt  # the job is killed while generating its third shard
        written.append(index)
        return real_write(run_dir, index, texts, shape)

    monkeypatch.setattr(generate_module, "write_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_generate(_options(tiny_model_dir, data, out))
    assert [p.name for p in completed_shards(out)] == ["shard-00000", "shard-00001"]
    before = {p.name: os.stat(p / "attention.npy").st_mtime_ns for p in completed_shards(out)}

    redone: list[int] = []

    def counting(run_dir: Path, index: int, texts, shape):
        redone.append(index)
        return real_write(run_dir, index, texts, shape)

    monkeypatch.setattr(generate_module, "write_shard", counting)
    with caplog.at_level(logging.WARNING, logger="training.generation"):
        run_generate(_options(tiny_model_dir, data, out))
    assert redone == [2, 3]
    assert f"resuming {out}: 2 of its 4 shards here are done already" in caplog.messages
    after = {p.name: os.stat(p / "attention.npy").st_mtime_ns for p in completed_shards(out)}
    assert all(after[name] == stamp for name, stamp in before.items())

    monkeypatch.setattr(generate_module, "write_shard", real_write)
    fresh = tmp_path / "fresh"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="training.generation"):
        run_generate(_options(tiny_model_dir, data, fresh))
    assert not [m for m in caplog.messages if m.startswith("resuming")]  # a new run says nothing of the kind
    resumed, uninterrupted = list(iter_texts([out])), list(iter_texts([fresh]))
    assert [t.meta for t in resumed] == [t.meta for t in uninterrupted]
    for a, b in zip(resumed, uninterrupted, strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-6)


def test_a_run_may_be_resumed_with_another_batch_size_and_keeps_its_answers(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--batch-size` is the one setting a rerun may change (less memory): the tokens stay the same, the
    numbers move only as a batched product's sums run in another order."""
    data, out, fresh = tiny_data["dev"], tmp_path / "run", tmp_path / "fresh"
    real_write = generate_module.write_shard

    def stopped_after_two(run_dir: Path, index: int, texts, shape):
        if index == 2:
            raise KeyboardInterrupt
        return real_write(run_dir, index, texts, shape)

    monkeypatch.setattr(generate_module, "write_shard", stopped_after_two)
    with pytest.raises(KeyboardInterrupt):
        run_generate(_options(tiny_model_dir, data, out, batch_size=4))
    monkeypatch.setattr(generate_module, "write_shard", real_write)
    run_generate(_options(tiny_model_dir, data, out, batch_size=1))
    run_generate(_options(tiny_model_dir, data, fresh, batch_size=4))
    resumed, uninterrupted = list(iter_texts([out])), list(iter_texts([fresh]))
    assert [t.meta for t in resumed] == [t.meta for t in uninterrupted]
    for a, b in zip(resumed, uninterrupted, strict=True):
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        for name in b.stats:
            np.testing.assert_allclose(a.stats[name], b.stats[name], atol=1e-4)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-4)


def test_rerun_with_other_settings_is_refused(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    run_generate(_options(tiny_model_dir, tiny_data["dev"][:1], out, limit=4))

    def must_not_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the changed settings were refused")

    with monkeypatch.context() as patched:  # settings that need no model are refused before it loads
        patched.setattr(generate_module, "load_model", must_not_load)
        with pytest.raises(SystemExit, match=r"different settings \(limit\)"):
            run_generate(_options(tiny_model_dir, tiny_data["dev"][:1], out, limit=5))
    with pytest.raises(SystemExit, match="different settings"):
        run_generate(_options(tiny_model_dir, tiny_data["dev"][:1], out, limit=4, n_lags=2))
    with pytest.raises(SystemExit, match="different settings"):
        run_generate(_options(tiny_model_dir, tiny_data["dev"][:1], out, limit=4, skip=4))


def test_bad_records_are_reported_and_skipped(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]]
) -> None:
    source = tiny_data["dev"][0]
    lines = source.read_text().splitlines()[:3]
    broken = tmp_path / "broken_dev.jsonl"
    broken.write_text("\n".join([lines[0], "{not json", json.dumps({"id": "x"}), lines[1]]) + "\n")
    out = tmp_path / "run"
    run_generate(_options(tiny_model_dir, [broken], out))
    texts = list(iter_texts([out]))
    assert [t.meta["line"] for t in texts] == [1, 4]
    report = (out / "bad_records.0.txt").read_text().splitlines()
    assert [line.split(":")[1] for line in report] == ["2", "3"]
    assert all(line.startswith(str(broken)) for line in report)


def test_bad_records_are_on_record_with_the_first_shard_done_even_if_the_run_is_stopped(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard done is never redone: a rerun would not find its bad records again."""
    lines = tiny_data["dev"][0].read_text().splitlines()[:3]
    broken = tmp_path / "broken_dev.jsonl"
    broken.write_text("\n".join([lines[0], "{not json", lines[1], lines[2]]) + "\n")
    written: list[int] = []
    write_shard = generate_module.write_shard

    def stopped_after_one(out: Path, index: int, *args: object) -> None:
        if written:
            raise KeyboardInterrupt
        write_shard(out, index, *args)  # type: ignore[arg-type]
        written.append(index)

    monkeypatch.setattr(generate_module, "write_shard", stopped_after_one)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_generate(_options(tiny_model_dir, [broken], out, shard_size=1))
    assert written == [0]
    (report,) = (out / "bad_records.0.txt").read_text().splitlines()
    assert report.startswith(f"{broken}:2")


def test_data_parallel_workers_split_the_shards(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]]
) -> None:
    out = tmp_path / "run"
    for rank in (0, 1):
        run_generate(_options(tiny_model_dir, tiny_data["dev"], out), generate_module.Distribution(rank=rank, world=2))
    assert [p.name for p in completed_shards(out)] == [f"shard-0000{i}" for i in range(4)]
    assert len(list(iter_texts([out]))) == 32


def test_a_partial_shard_is_never_read(tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]]) -> None:
    out = tmp_path / "run"
    run_generate(_options(tiny_model_dir, tiny_data["dev"][:1], out, limit=8))
    shard = completed_shards(out)[0]
    leftover = shard.with_name("shard-00001.partial")  # a writer killed just before its rename
    import shutil

    shutil.copytree(shard, leftover)
    assert completed_shards(out) == [shard]


def test_few_shot_runs_take_examples_from_the_train_split_beside_the_data(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]]
) -> None:
    from training.tasks import PromptStyle

    out = run_generate(
        _options(tiny_model_dir, tiny_data["dev"][:1], tmp_path / "run", limit=4, prompt_style=PromptStyle.FEW_SHOT)
    )
    settings = json.loads((out / "run.json").read_text())
    assert [Path(item["path"]).name for item in settings["shots"]] == [
        tiny_data["dev"][0].name.replace("_dev", "_train")
    ]
    texts = list(iter_texts([out]))
    assert len(texts) == 4 and all(t.meta["prompt_style"] == "few-shot" for t in texts)
    lonely = tmp_path / "alone" / "squad_dev.jsonl"
    lonely.parent.mkdir()
    lonely.write_text(tiny_data["dev"][0].read_text())
    with pytest.raises(SystemExit, match="few-shot prompts need examples"):
        run_generate(_options(tiny_model_dir, [lonely], tmp_path / "run2", prompt_style=PromptStyle.FEW_SHOT))


def test_no_valid_records_is_refused_before_anything_is_written(tmp_path: Path, tiny_model_dir: Path) -> None:
    """An empty run would refuse the rerun with the right file (as run with other settings)."""
    empty, broken = tmp_path / "empty_dev.jsonl", tmp_path / "broken_dev.jsonl"
    empty.write_text("")
    broken.write_text("{not json\n")
    with pytest.raises(SystemExit, match=r"no valid records in .*empty_dev\.jsonl: the files hold no records"):
        run_generate(_options(tiny_model_dir, [empty], tmp_path / "run"))
    with pytest.raises(SystemExit, match=r"1 lines refused, the first .*broken_dev.jsonl:1"):
        run_generate(_options(tiny_model_dir, [broken], tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_a_skip_past_the_end_is_a_finished_extension_and_only_warned_about(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger=generate_module.__name__):
        run_generate(_options(tiny_model_dir, [tiny_data["dev"][0]], tmp_path / "run", skip=10_000))
    assert "no valid record left in" in caplog.text and "after --skip 10000" in caplog.text


def test_a_rerun_may_spell_the_same_files_relatively(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    data = tiny_data["dev"][0]
    run_generate(_options(tiny_model_dir, [data], out, limit=2))
    monkeypatch.chdir(data.parent)
    relative_model = os.path.relpath(tiny_model_dir, data.parent)
    run_generate(_options(Path(relative_model), [Path(data.name)], out, limit=2))
    assert len(list(iter_texts([out]))) == 2


def test_a_run_made_when_chat_was_called_bare_is_continued_as_chat(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]]
) -> None:
    from training.tasks import PromptStyle

    out = tmp_path / "run"
    chat = _options(tiny_model_dir, tiny_data["dev"][:1], out, limit=4, prompt_style=PromptStyle.CHAT)
    run_generate(chat)
    settings = json.loads((out / "run.json").read_text())
    assert settings["prompt_style"] == "chat"
    (out / "run.json").write_text(json.dumps({**settings, "prompt_style": "bare"}))  # as runs before the rename
    run_generate(chat)  # the same settings: nothing to redo, nothing refused
    assert len(list(iter_texts([out]))) == 4
    with pytest.raises(SystemExit, match=r"different settings \(prompt_style\)"):
        run_generate(replace(chat, prompt_style=PromptStyle.TASK))


def test_a_duplicate_id_is_a_bad_record_not_a_second_answer(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]]
) -> None:
    # Every command after generate refuses an answer key seen twice: the run must not hold one.
    lines = tiny_data["dev"][0].read_text().splitlines()[:2]
    twice = tmp_path / "twice_dev.jsonl"
    twice.write_text("\n".join([lines[0], lines[1], lines[0]]) + "\n")
    out = tmp_path / "run"
    run_generate(_options(tiny_model_dir, [twice], out))
    assert [t.meta["line"] for t in iter_texts([out])] == [1, 2]
    (report,) = (out / "bad_records.0.txt").read_text().splitlines()
    assert report.startswith(f"{twice}:3") and f"first at {twice}:1" in report


def test_a_run_whose_generate_has_not_finished_is_read_with_a_warning(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]], caplog: pytest.LogCaptureFixture
) -> None:
    import shutil

    out = tmp_path / "run"
    run_generate(_options(tiny_model_dir, tiny_data["dev"][:1], out))
    with caplog.at_level("WARNING", logger="training.runs"):
        complete = list(iter_texts([out]))
    assert not caplog.records
    shards = completed_shards(out)
    shutil.rmtree(shards[-1])  # what a generate killed before its last shard leaves
    with caplog.at_level("WARNING", logger="training.runs"):
        partial = list(iter_texts([out]))
    assert len(partial) < len(complete)
    assert f"holds {len(shards) - 1} of its {len(shards)} shards" in caplog.text


def test_a_shards_too_long_prompts_stay_on_record_when_the_run_is_killed_as_the_shard_is_written(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records skipped while a shard is answered (a prompt too long) are found only then: a kill between the
    shard and its report must not leave a done shard whose skipped records no rerun reports."""
    lines = tiny_data["dev"][0].read_text().splitlines()[:2]
    long = json.loads(lines[0])
    long["question"] = " ".join([long["question"]] * 100)
    data = tmp_path / "long_dev.jsonl"
    data.write_text("\n".join([json.dumps(long), lines[1]]) + "\n")
    report_bad_records = generate_module.report_bad_records

    def killed(*args: object) -> int:
        raise KeyboardInterrupt  # the first report, as the shard that skipped the long prompt is finished

    monkeypatch.setattr(generate_module, "report_bad_records", killed)
    out = tmp_path / "run"
    options = _options(tiny_model_dir, [data], out, shard_size=2, max_prompt_tokens=300)
    with pytest.raises(KeyboardInterrupt):
        run_generate(options)
    monkeypatch.setattr(generate_module, "report_bad_records", report_bad_records)
    run_generate(options)
    (report,) = (out / "bad_records.0.txt").read_text().splitlines()
    assert report.startswith(f"{data}:1") and [t.meta["line"] for t in iter_texts([out])] == [2]


def test_a_damaged_shard_is_named_not_met_as_a_numpy_or_key_error(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]]
) -> None:
    out = tmp_path / "run"
    run_generate(_options(tiny_model_dir, tiny_data["dev"][:1], out, limit=8))
    shard = completed_shards(out)[0]
    attention = shard / "attention.npy"
    attention.write_bytes(attention.read_bytes()[:200])
    with pytest.raises(
        SystemExit, match=rf"shard {shard} is damaged .*move the folder aside and rerun the same generate"
    ):
        list(iter_texts([out]))
    original = (shard / "texts.json").read_text()
    metas = json.loads(original)
    del metas[0]["target"]
    (shard / "texts.json").write_text(json.dumps(metas))
    with pytest.raises(SystemExit, match="has no target"):
        list(iter_texts([out]))
    (shard / "texts.json").write_text(original)
    (shard / "stat-logprob.npy").unlink()  # read before the (damaged) attention: named, not a KeyError later
    with pytest.raises(SystemExit, match=rf"shard {shard} is damaged \(KeyError: 'no stat-logprob.npy'\)"):
        list(iter_texts([out]))
    (shard / "stat-logprob.npy").write_bytes(b"")  # what a disk that filled up as it was written leaves
    with pytest.raises(SystemExit, match=rf"shard {shard} is damaged \(EOFError"):
        list(iter_texts([out]))


def test_another_device_than_this_machine_has_is_one_clear_error(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]]
) -> None:
    from app.engine.loading import ModelLoadError

    with pytest.raises(ModelLoadError, match="not a device name"):
        run_generate(_options(tiny_model_dir, tiny_data["dev"][:1], tmp_path / "bogus", device="bogus"))
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA device"):
            run_generate(_options(tiny_model_dir, tiny_data["dev"][:1], tmp_path / "cuda", device="cuda"))


def test_a_folder_that_is_not_a_run_is_not_written_into(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]]
) -> None:
    out = tmp_path / "notes"
    out.mkdir()
    (out / "notes.txt").write_text("someone's files")
    with pytest.raises(SystemExit, match=r"--out .*notes is a folder with other files in it"):
        run_generate(_options(tiny_model_dir, tiny_data["dev"][:1], out, limit=4))
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    run_generate(_options(tiny_model_dir, tiny_data["dev"][:1], empty, limit=4))
    assert (empty / "run.json").is_file()


def test_a_run_records_bfloat16_products_computed_in_float32_only_where_they_were() -> None:
    identity = ModelIdentity(name="m", source="m", sha256="0" * 64, num_layers=2, num_heads=2, vocab_size=8)
    assert "bf16_products" not in run_settings(identity, "bfloat16", {})  # runs made before it resume
    assert run_settings(identity, "bfloat16", {}, wide_bf16_products=True)["bf16_products"] == WIDE_BF16_PRODUCTS
    assert "bf16_products" in LOADED_MODEL_SETTINGS  # known after the load: not compared before it


def test_a_run_whose_every_record_is_skipped_fails_and_fit_says_why(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]]
) -> None:
    from training.fit.texts import load_runs

    out = tmp_path / "run"
    # every prompt longer than 5 tokens: each record is skipped as bad, and the shard holds no answer
    with pytest.raises(SystemExit, match=r"none of the 5 records gave an answer; see .*bad_records\.0\.txt"):
        run_generate(_options(tiny_model_dir, tiny_data["dev"][:1], out, limit=5, max_prompt_tokens=5))
    with pytest.raises(SystemExit, match="the runs hold no answers"):
        load_runs([out], None)
