"""Linked copies of runs with each head's attention mass on the prompt per token."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from app.engine.loading import LoadedModel
from app.engine.prompt_attention import PROMPT_MASS, PROMPT_SINK, prompt_statistic_names
from benchmarks.prompt_attention_runs import main, prompt_attention
from training.cli import main as training_main
from training.runs import completed_shards, iter_texts


def test_mass_and_sink_are_each_producing_steps_weights_on_the_prompt_and_its_first_position() -> None:
    prompt_length, answer = 3, 2
    rng = np.random.default_rng(0)
    rows = rng.random((1, 2, answer + 1, prompt_length + answer)).astype(np.float32)  # [layers, heads, q, keys]
    statistics = prompt_attention(rows, prompt_length)
    mass, sink = statistics[PROMPT_MASS], statistics[PROMPT_SINK]
    assert mass.shape == sink.shape == (answer, 1, 2)
    for token in range(answer):  # token i's producing step is row i; the last row consumes the last token
        np.testing.assert_allclose(mass[token, 0], rows[0, :, token, 1:prompt_length].sum(axis=-1), rtol=1e-6)
        np.testing.assert_allclose(sink[token, 0], rows[0, :, token, 0], rtol=1e-6)


def test_copies_add_a_statistic_per_head_consistent_with_the_stored_rows(
    tiny_runs: dict[str, Path], tiny_loaded: LoadedModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tiny_runs["dev"]
    before = sorted(p.name for shard in completed_shards(run) for p in shard.iterdir())
    main(["--out", str(tmp_path), str(run)])
    printed = capsys.readouterr().out
    written = re.search(r"(\d+) shards written, largest difference (\S+)", printed)
    assert written is not None
    # The eager forward reproduces the generation's step rows on every slot both hold.
    assert int(written[1]) == len(completed_shards(run)) and float(written[2]) < 1e-5
    layers, heads = tiny_loaded.identity.num_layers, tiny_loaded.identity.num_heads
    names = list(prompt_statistic_names(layers, heads, [PROMPT_MASS]))
    sinks = list(prompt_statistic_names(layers, heads, [PROMPT_SINK]))
    copy = tmp_path / run.name
    for shard in completed_shards(copy):
        assert (shard / "attention.npy").is_symlink() and not (shard / f"stat-{names[0]}.npy").is_symlink()
    originals, copies = list(iter_texts([run])), list(iter_texts([copy]))
    assert [t.key for t in copies] == [t.key for t in originals]
    for original, copied in zip(originals, copies, strict=True):
        assert set(names + sinks) <= set(copied.stats)
        np.testing.assert_array_equal(copied.stats["logprob"], original.stats["logprob"])
        mass = np.stack([copied.stats[name] for name in names], axis=1).reshape(len(copied), layers, heads)
        sink = np.stack([copied.stats[name] for name in sinks], axis=1).reshape(len(copied), layers, heads)
        assert np.all(mass > 0) and np.all(sink > 0) and np.all(mass + sink < 1 + 1e-5)
        # A producing step's weights sum to 1: while token i <= N, its generated keys are all in the
        # stored row i - 1 (slots 0 .. i - 1), and with the prompt's weights they make up the whole.
        rows = original.rows
        for token in range(1, min(len(copied), rows.shape[-1])):
            generated = rows[token - 1, :, :, :token].sum(axis=-1)
            np.testing.assert_allclose(mass[token] + sink[token] + generated, 1.0, atol=1e-5)
    # The run itself is untouched, and a second pass has nothing left to do.
    assert sorted(p.name for shard in completed_shards(run) for p in shard.iterdir()) == before
    main(["--out", str(tmp_path), str(run)])
    assert "0 shards written" in capsys.readouterr().out


def test_names_print_one_extra_feature_set_and_lodo_fits_it(
    tiny_runs: dict[str, Path],
    tiny_loaded: LoadedModel,
    tiny_artifact: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    layers, heads = tiny_loaded.identity.num_layers, tiny_loaded.identity.num_heads
    main(["--names", str(layers), str(heads)])
    names = capsys.readouterr().out.strip().split("+")
    assert names == list(prompt_statistic_names(layers, heads, [PROMPT_MASS])) and len(set(names)) == layers * heads
    main(["--names", str(layers), str(heads), "--family", PROMPT_MASS, PROMPT_SINK])
    both = capsys.readouterr().out.strip().split("+")
    assert both == list(prompt_statistic_names(layers, heads))
    main(["--out", str(tmp_path / "copies"), str(tiny_runs["train"]), str(tiny_runs["dev"])])
    out = tmp_path / "lodo"
    training_main(
        [
            "lodo",
            str(tmp_path / "copies" / "train"),
            "--test",
            str(tmp_path / "copies" / "dev"),
            "--artifact",
            str(tiny_artifact),
            "--out",
            str(out),
            "--bootstrap",
            "20",
            "--extra-stats",
            *both,
        ]
    )
    assert json.loads((out / "lodo.json").read_text())["configuration"]["extra_stats"] == both


def test_runs_and_out_are_required_without_names_and_family_only_with_them(
    tiny_runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([])
    assert "give the runs and --out" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), str(tiny_runs["dev"]), "--family", PROMPT_SINK])
    assert "--family goes with --names" in capsys.readouterr().err
