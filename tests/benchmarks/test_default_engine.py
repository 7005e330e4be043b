"""Which artifact the benchmarks' shared `--model`/`--artifact` arguments pick."""

import argparse
from pathlib import Path

from app.settings import MODEL_ARTIFACTS
from benchmarks.default_engine import add_model_arguments, artifact_path


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_artifact_follows_a_catalog_model() -> None:
    assert artifact_path(_parse()) == MODEL_ARTIFACTS["qwen2.5-coder-1.5b"]
    assert artifact_path(_parse("--model", "smollm2-135m")) == MODEL_ARTIFACTS["smollm2-135m"]


def test_another_model_has_no_artifact_unless_one_is_named(tmp_path: Path) -> None:
    assert artifact_path(_parse("--model", "pkg:some-package/model.gguf")) is None
    assert artifact_path(_parse("--model", "smollm2-135m", "--artifact", str(tmp_path))) == tmp_path


def test_an_empty_artifact_means_none() -> None:
    assert artifact_path(_parse("--model", "smollm2-135m", "--artifact", "")) is None
