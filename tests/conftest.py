"""Shared fixtures: a tiny random Llama-style model (built in about a second) and what is made from it."""

from __future__ import annotations

import gc
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from app.engine.engine import Engine
from app.engine.loading import LoadedModel, load_model
from app.settings import Settings
from tests.fixtures.tiny_model import WORDS, write_tiny_model

N_LAGS = 4

# The tiny model's matmuls are too small to gain from threads, and on a busy machine
# OpenMP threads spinning against other processes make them up to 50x slower.
torch.set_num_threads(1)
# The tiny model's references (eager attention, stored traces) are float32; `auto` would pick bfloat16 on
# a CPU that computes it natively. bfloat16 has its own tests (tests/app/engine/test_bfloat16.py).
os.environ.setdefault("TAD_DTYPE", "float32")


@pytest.fixture(autouse=True)
def _unfreeze_the_collector() -> Iterator[None]:
    """A service started in a test freezes what its loading left out of the cyclic collector (as a server
    does once); the apps of finished tests, kept alive by reference cycles, must still be collectable."""
    yield
    gc.unfreeze()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_loaded(tiny_model_dir: Path) -> LoadedModel:
    torch.manual_seed(0)
    return load_model(str(tiny_model_dir), dtype="float32")


@pytest.fixture(scope="session")
def engine(tiny_loaded: LoadedModel) -> Engine:
    return Engine(tiny_loaded, n_lags=N_LAGS)


def _records(rng: random.Random, count: int, split: str) -> dict[str, list[dict]]:
    """Synthetic QA records in the shared JSONL format, worded with the tiny model's vocabulary."""
    words = [w for w in WORDS if w.isalpha() and len(w) > 1]
    squad, mmlu = [], []
    for i in range(count):
        context = " ".join(rng.choice(words) for _ in range(30))
        answer = rng.choice(words)
        squad.append(
            {
                "id": f"squad-{split}-{i}",
                "question": f"what is the {rng.choice(words)} of {rng.choice(words)} ?",
                "answers": [answer],
                "context": context,
                "source": "synthetic",
                "task": "extractive_qa",
            }
        )
        choices = rng.sample(words, 4)
        index = rng.randrange(4)
        mmlu.append(
            {
                "id": f"mmlu-{split}-{i}",
                "question": f"which {rng.choice(words)} is {rng.choice(words)} ?",
                "answers": [choices[index]],
                "choices": choices,
                "source": "synthetic",
                "task": "multiple_choice",
                "meta": {"answer_key": "ABCD"[index], "answer_index": index},
            }
        )
    return {"squad": squad, "mmlu": mmlu}


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """{"train": [...files], "dev": [...files]}: small synthetic JSONL files."""
    folder = tmp_path_factory.mktemp("data")
    rng = random.Random(0)
    files: dict[str, list[Path]] = {}
    for split, count in (("train", 24), ("dev", 16)):
        for name, records in _records(rng, count, split).items():
            path = folder / f"{name}_{split}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
            files.setdefault(split, []).append(path)
    return files


@pytest.fixture(scope="session")
def tiny_runs(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, tiny_data: dict[str, list[Path]]
) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("runs")
    return {split: tiny_run(tiny_model_dir, tiny_data[split], folder / split) for split in ("train", "dev")}


def tiny_run(model_dir: Path, data: list[Path], out: Path) -> Path:
    """A generation run of the tiny model, with the settings of the session's `tiny_runs`."""
    from training.generation import GenerateOptions, run_generate

    options = GenerateOptions(
        data=data,
        out=out,
        model=str(model_dir),
        dtype="float32",
        n_lags=N_LAGS,
        max_new_tokens=10,
        batch_size=8,
        shard_size=16,
    )
    return run_generate(options)


@pytest.fixture(scope="session")
def tiny_artifact(tmp_path_factory: pytest.TempPathFactory, tiny_runs: dict[str, Path]) -> Path:
    """A TAD artifact fitted and calibrated on the tiny model's runs."""
    from training.calibration import CalibrationTargets, run_calibrate
    from training.fit.options import FitOptions
    from training.fit.pipeline import run_fit
    from training.run_source import RunSource

    out = tmp_path_factory.mktemp("artifact") / "tiny-tad"
    run_fit(FitOptions(runs=[tiny_runs["train"]], out=out, alphas=(1.0, 0.01)))
    source = RunSource(data=[], runs=[tiny_runs["dev"]], default_run_dir=out / "unused")
    run_calibrate(out, source, CalibrationTargets(coverages=[0.5, 0.8], errors=[0.9], delta=0.1))
    return out


@pytest.fixture(scope="session")
def service_settings(tiny_model_dir: Path, tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(
        model=str(tiny_model_dir),
        artifact_dir=tiny_artifact,
        cache_dir=tmp_path_factory.mktemp("cache"),
        default_max_new_tokens=8,
        max_new_tokens_limit=32,
        max_prompt_tokens=200,
        batch_window_ms=2.0,
    )


@pytest.fixture(scope="session")
def tiny_calibration_artifact(tmp_path_factory: pytest.TempPathFactory, tiny_runs: dict[str, Path]) -> Path:
    """A calibration-only artifact (no regressor) from the tiny model's training answers, their targets set so
    that each dataset is half right (the random model gets none right): informative, as the rule needs."""
    from tests.fixtures.labelled_artifact import half_right, relabelled_copy
    from training.calibration_artifact import CalibrationArtifactOptions, build_calibration_artifact

    run = relabelled_copy(tiny_runs["train"], tmp_path_factory.mktemp("labelled") / "train", half_right)
    out = tmp_path_factory.mktemp("calibration") / "tiny-calibration-only"
    build_calibration_artifact(
        CalibrationArtifactOptions(out=out, runs=[run], errors=(0.5, 0.7, 0.9), delta=0.2, resamples=50)
    )
    return out


@pytest.fixture(scope="session")
def tiny_p_true_artifact(tmp_path_factory: pytest.TempPathFactory, tiny_runs: dict[str, Path]) -> Path:
    """A calibration-only artifact deciding with P(True): its answers labelled by the check's own ranking."""
    from tests.fixtures.labelled_artifact import labelled_by_score

    return labelled_by_score(tmp_path_factory, tiny_runs["train"], "p_true")
