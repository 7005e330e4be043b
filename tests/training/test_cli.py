"""The CLI's error boundary and argument checks: a user's mistake is one line and an exit status, not a
traceback or a failure minutes later."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from training.cli import INTERRUPTED, build_parser, main


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 1) -> str:
    """Run the CLI expecting exit status `code`; what it printed to stderr (or the SystemExit message)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    message = exit_info.value.code if isinstance(exit_info.value.code, str) else None
    assert message is not None or exit_info.value.code == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return message or err


@pytest.mark.parametrize("kind", ["missing", "folder"])
def test_unreadable_data_is_one_line(
    kind: str, tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data.jsonl"
    if kind == "folder":
        data.mkdir()
    err = _fails(
        ["generate", "--data", str(data), "--out", str(tmp_path / "run"), "--model", str(tiny_model_dir)], capsys
    )
    assert err.startswith("error: ") and str(data) in err and len(err.strip().splitlines()) == 1


def test_a_bad_model_is_one_line(
    tmp_path: Path, tiny_data: dict[str, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["generate", "--data", str(tiny_data["dev"][0]), "--out", str(tmp_path / "run")]
    err = _fails([*argv, "--model", str(tmp_path / "no-model")], capsys)
    assert err.startswith("error: ") and "no-model" in err


def test_a_bad_artifact_is_one_line(
    tmp_path: Path, tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "artifact").mkdir()
    argv = ["evaluate", "--artifact", str(tmp_path / "artifact"), "--run", str(tiny_runs["dev"])]
    err = _fails([*argv, "--out", str(tmp_path / "report")], capsys)
    assert err.startswith("error: ")


def test_a_corrupt_run_is_named(
    tmp_path: Path, tiny_artifact: Path, tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:

    run = tmp_path / "run"
    shutil.copytree(tiny_runs["dev"], run)
    (run / "run.json").write_text('{"model": ')
    argv = ["evaluate", "--artifact", str(tiny_artifact), "--run", str(run), "--out", str(tmp_path / "report")]
    assert "run.json is corrupt" in _fails(argv, capsys)


def test_ctrl_c_says_what_a_rerun_does(
    tiny_runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import training.run_summary as summary

    def interrupted(*args: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(summary, "summarise", interrupted)
    try:
        err = _fails(["summary", str(tiny_runs["dev"])], capsys, code=130)
    except KeyboardInterrupt:  # uncaught, it would stop the whole test session
        pytest.fail("Ctrl-C escaped the CLI as a traceback")
    assert "rerunning starts over" in err and "resumes" not in err  # summary keeps nothing to resume from


def test_ctrl_c_while_the_libraries_are_imported_says_what_a_rerun_does_too(
    tiny_runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first seconds of every command import torch and transformers: a Ctrl-C then is no traceback."""
    import sys
    import types

    class Importing(types.ModuleType):
        def __getattr__(self, name: str) -> object:
            if name == "ModelLoadError":  # what the CLI imports from it; the rest (e.g. repr's) as any module
                raise KeyboardInterrupt
            raise AttributeError(name)

    monkeypatch.setitem(sys.modules, "app.engine.loading", Importing("app.engine.loading"))
    try:
        err = _fails(["summary", str(tiny_runs["dev"])], capsys, code=130)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped the CLI as a traceback")
    assert "interrupted: " in err and "rerunning starts over" in err


def test_sigterm_ends_a_command_as_ctrl_c_does_and_the_handler_is_put_back(
    tiny_runs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import os
    import signal

    import training.run_summary as summary

    def terminated(*args: object) -> str:
        os.kill(os.getpid(), signal.SIGTERM)  # what `timeout` or a batch scheduler sends
        return ""

    monkeypatch.setattr(summary, "summarise", terminated)
    before = signal.getsignal(signal.SIGTERM)
    err = _fails(["summary", str(tiny_runs["dev"])], capsys, code=143)
    assert "interrupted: " in err and "rerunning starts over" in err
    assert signal.getsignal(signal.SIGTERM) is before


def test_every_command_says_what_an_interruption_leaves() -> None:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(INTERRUPTED) == set(commands.choices)
    assert "resumes" in INTERRUPTED["generate"] and "resumes" not in INTERRUPTED["summary"]
    assert "resumes its finished held-out datasets" in INTERRUPTED["lodo"]
    assert "resumes its finished trials" in INTERRUPTED["fit"] and "MLP folds" in INTERRUPTED["fit"]


@pytest.mark.parametrize(
    "settings",
    [
        "{}",
        "[]",
        '"abc"',
        '{"n_lags": "ten", "model_sha256": "x", "identity": {}}',
        '{"n_lags": 10}',
        '{"n_lags": 10, "model_sha256": "x", "identity": {"name": "m"}}',
    ],
)
def test_run_settings_that_are_not_a_runs_are_named(
    settings: str, tmp_path: Path, tiny_artifact: Path, tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_runs["dev"], run)
    (run / "run.json").write_text(settings)
    for argv in (
        ["evaluate", "--artifact", str(tiny_artifact), "--run", str(run), "--out", str(tmp_path / "report")],
        ["fit", str(run), "--out", str(tmp_path / "artifact")],
        ["summary", str(run)],
    ):
        assert "run.json is not a run's settings" in _fails(argv, capsys)


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        ("evaluate", ["--data", "d.jsonl"]),
        ("evaluate", ["--limit", "5", "--model", "m"]),
        ("calibrate", ["--max-new-tokens", "8"]),
        ("calibrate", ["--run-dir", "somewhere"]),
        ("calibrate", ["--prompt-style", "chat"]),
    ],
)
def test_generation_options_with_run_are_refused_not_ignored(
    command: str,
    extra: list[str],
    tmp_path: Path,
    tiny_artifact: Path,
    tiny_runs: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [command, "--artifact", str(tiny_artifact), "--run", str(tiny_runs["dev"]), *extra]
    argv += ["--out", str(tmp_path / "report")] if command == "evaluate" else ["--coverage", "0.5"]
    err = _fails(argv, capsys, code=2)
    one = len([word for word in extra if word.startswith("--")]) == 1
    assert ("only applies when generating: with --run, leave it out" if one else "only apply when") in err
    assert extra[0] in err


@pytest.mark.parametrize("command", ["evaluate", "calibrate"])
def test_answers_given_twice_are_refused(
    command: str, tmp_path: Path, tiny_artifact: Path, tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    artifact = tmp_path / "artifact"
    shutil.copytree(tiny_artifact, artifact)
    before = (artifact / "manifest.json").read_text()
    twice = ["--artifact", str(artifact), "--run", str(tiny_runs["dev"]), str(tiny_runs["dev"])]
    extra = ["--out", str(tmp_path / "report")] if command == "evaluate" else ["--coverage", "0.5"]
    assert "more than once" in _fails([command, *twice, *extra], capsys)
    assert (artifact / "manifest.json").read_text() == before


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--data", "d", "--out", "o", "--shard-size", "0"],
        ["generate", "--data", "d", "--out", "o", "--batch-size", "0"],
        ["generate", "--data", "d", "--out", "o", "--n-lags", "0"],
        ["generate", "--data", "d", "--out", "o", "--limit", "-1"],
        ["generate", "--data", "d", "--out", "o", "--limit", "0"],  # not "the files hold no records"
        ["generate", "--data", "d", "--out", "o", "--skip", "-1"],
        ["generate", "--data", "d", "--out", "o", "--max-new-tokens", "0"],
        ["generate", "--data", "d", "--out", "o", "--shard-size", "x"],
        ["fit", "r", "--out", "o", "--alphas", "1", "0"],
        ["fit", "r", "--out", "o", "--stage1-alphas", "-1"],
        ["fit", "r", "--out", "o", "--folds", "1"],
        ["evaluate", "--artifact", "a", "--run", "r", "--out", "o", "--bootstrap", "-1"],
        ["lodo", "r", "--test", "t", "--artifact", "a", "--out", "o", "--bootstrap", "-1"],
        ["calibrate", "--artifact", "a", "--run", "r", "--coverage", "0.5", "--delta", "1.5"],
        ["calibrate", "--artifact", "a", "--run", "r", "--coverage", "0.5", "--delta", "nan"],
        ["fit", "r", "--out", "o", "--epsilon", "0"],
        ["generate", "--data", "d", "--out", "o", "--max-prompt-tokens", "0"],
    ],
)
def test_bad_numbers_are_refused_when_parsed(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    option = [item for item in argv if item.startswith("--")][-1]
    assert f"argument {option}: " in err and ("must be" in err or "not an integer" in err)


@pytest.mark.parametrize(
    ("argv", "needs"),
    [
        (["--mlp-average"], "--mlp-average needs --mlp"),
        (["--mlp", "--force-average"], "--force-average needs --mlp-average"),
        (["--mlp-width", "64"], "--mlp-width needs --mlp"),
        (["--mlp-grid", "small", "--mlp-width", "64"], "--mlp-width and --mlp-grid need --mlp"),
    ],
)
def test_stage_2_options_without_what_they_build_on_are_refused(
    argv: list[str], needs: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "r", "--out", "o", *argv])
    assert exit_info.value.code == 2 and needs in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_summary_and_evaluate_refuse_a_path_that_is_not_a_run(
    kind: str, tmp_path: Path, tiny_artifact: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run"
    if kind == "file":
        path.write_text("")
    expected = "does not exist" if kind == "missing" else "not a folder"
    assert expected in _fails(["summary", str(path)], capsys)
    argv = ["evaluate", "--artifact", str(tiny_artifact), "--run", str(path), "--out", str(tmp_path / "report")]
    assert expected in _fails(argv, capsys)
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--data", "d", "--out", "o", "--prompt-attention"],
        ["generate", "--data", "d", "--out", "o", "--shots-from", "s"],
        ["fit", "r", "--out", "o", "--extra-stats", "entropy"],
        ["fit", "r", "--out", "o", "--extra-feature-sets", "none"],
        ["fit", "r", "--out", "o", "--products"],
        ["fit", "r", "--out", "o", "--mlp", "--mlp-average", "--mlp-seeds", "2"],
        ["fit", "r", "--out", "o", "--mlp", "--mlp-standardise"],
        ["lodo", "r", "--test", "t", "--artifact", "a", "--out", "o", "--extra-stats", "entropy"],
        ["lodo", "r", "--test", "t", "--artifact", "a", "--out", "o", "--products"],
        ["rescore", "r"],
    ],
)
def test_options_of_studies_not_adopted_are_gone(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err or "invalid choice: 'rescore'" in err


def test_a_default_target_that_was_not_asked_for_is_refused_before_calibrating(
    tiny_artifact: Path, tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["calibrate", "--artifact", str(tiny_artifact), "--run", str(tiny_runs["dev"]), "--error", "0.3"]
    err = _fails([*argv, "--default-target", "error@0.42"], capsys, code=2)
    assert "--default-target error@0.42 is not one of the targets asked for (coverage@0.5" in err


def test_an_out_that_cannot_be_a_run_folder_is_refused_before_the_model_loads(
    tmp_path: Path, tiny_data: dict[str, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-file").write_text("")
    argv = ["generate", "--data", str(tiny_data["dev"][0]), "--out", str(tmp_path / "a-file")]
    # A model that would fail to load: refused for --out first, so it was never loaded.
    err = _fails([*argv, "--model", str(tmp_path / "no-model")], capsys, code=2)
    assert "a-file is a file" in err and "no-model" not in err


def test_a_model_without_a_chat_template_is_sent_to_few_shot_before_anything_is_written(
    tmp_path: Path, tiny_model_dir: Path, tiny_data: dict[str, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    base = Path(shutil.copytree(tiny_model_dir, tmp_path / "base-model"))
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    (base / "chat_template.jinja").unlink(missing_ok=True)
    argv = ["generate", "--data", str(tiny_data["dev"][0]), "--out", str(tmp_path / "run"), "--model", str(base)]
    assert "has no chat template (a base model): generate with --prompt-style few-shot" in _fails(argv, capsys)
    assert not (tmp_path / "run").exists()


def test_summary_refuses_answers_given_twice(tiny_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Counted twice, a run's answers could move a dataset across the informative bounds scripts train on."""
    assert "more than once" in _fails(["summary", str(tiny_runs["dev"]), str(tiny_runs["dev"])], capsys)
    assert "more than once" in _fails(
        ["summary", "--informative", str(tiny_runs["dev"]), str(tiny_runs["dev"])], capsys
    )
