"""Without the training extra (`make install` alone) a command says so at once, in one line, before any model
loads; --help still works."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import training.extra as extra
from training.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]

# Run first in the child: a finder ahead of all others that refuses the extra's modules, as an install without
# them does, and a report at exit of whether anything that loads a model was imported.
WITHOUT_EXTRA = """
import atexit, sys

class NoTrainingExtra:
    blocked = {blocked}

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NoTrainingExtra())
LOADERS = ("torch", "transformers", "app.engine.loading")
atexit.register(lambda: print("loaded:", sorted(m for m in LOADERS if m in sys.modules)))
"""


def _without_extra(code: str) -> subprocess.CompletedProcess[str]:
    prelude = WITHOUT_EXTRA.format(blocked=set(extra.TRAIN_EXTRA.values()))
    return subprocess.run(
        [sys.executable, "-c", prelude + code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_modules_checked_are_pyprojects_train_extra() -> None:
    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["train"]
    assert {re.split(r"[<>=!~\[; ]", requirement)[0] for requirement in requirements} == set(extra.TRAIN_EXTRA)


def test_the_message_names_what_is_missing_and_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    assert extra.missing_extra_message() is None  # this environment has it
    monkeypatch.setattr(extra, "missing_modules", lambda: ["rouge_score", "scipy"])
    message = extra.missing_extra_message()
    assert message is not None and "\n" not in message
    assert "rouge_score, scipy" in message and "make install-dev" in message and 'pip install -e ".[train]"' in message


def test_generate_stops_before_loading_the_model(
    tiny_model_dir: Path, tiny_data: dict[str, list[Path]], tmp_path: Path
) -> None:
    """The issue's case: `generate` on the serve install used to die at the first TruthfulQA answer."""
    out = tmp_path / "run"
    argv = ["generate", "--data", str(tiny_data["dev"][0]), "--out", str(out), "--model", str(tiny_model_dir)]
    done = _without_extra(
        f"import runpy; sys.argv = ['training', *{json.dumps(argv)}]; runpy.run_module('training', run_name='__main__')"
    )
    assert done.returncode == extra.EXIT_STATUS
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: the training extra is not installed") and "make install-dev" in line
    assert done.stdout.strip() == "loaded: []" and not out.exists()


def test_every_command_stops_at_once() -> None:
    argvs = {
        "generate": ["--data", "d.jsonl", "--out", "o"],
        "fit": ["r", "--out", "o"],
        "evaluate": ["--artifact", "a", "--run", "r", "--out", "o"],
        "calibrate": ["--artifact", "a", "--run", "r"],
        "lodo": ["r", "--test", "t", "--artifact", "a", "--out", "o"],
        "summary": ["r"],
        "calibration-artifact": ["--out", "o", "--data", "d_train.jsonl"],
    }
    assert set(argvs) == set(COMMANDS)
    done = _without_extra(
        "from training.cli import main\n"
        f"for name, argv in {json.dumps(argvs)}.items():\n"
        "    try:\n"
        "        main([name, *argv])\n"
        "    except SystemExit as stop:\n"
        "        print(name, stop.code)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:-1] == [f"{name} {extra.EXIT_STATUS}" for name in argvs]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == len(argvs) and all("make install-dev" in line for line in lines)
    assert done.stdout.splitlines()[-1] == "loaded: []"


def test_help_works_without_the_extra_and_loads_nothing() -> None:
    done = _without_extra(
        "from training.cli import main\n"
        f"for command in {json.dumps([[], *([name] for name in COMMANDS)])}:\n"
        "    try:\n"
        "        main([*command, '--help'])\n"
        "    except SystemExit as stop:\n"
        "        assert stop.code == 0, (command, stop.code)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("usage: python -m training") == 1 + len(COMMANDS)
    assert done.stdout.strip().splitlines()[-1] == "loaded: []"
