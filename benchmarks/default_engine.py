"""What the in-process benchmarks share: the model options, the capturing engine they time, a long prompt."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch

from app.engine.engine import Engine
from app.engine.loading import LoadedModel, load_model
from app.settings import DEFAULT_MODEL, committed_artifact
from app.uncertainty.artifact import TadArtifact, load_artifact
from app.uncertainty.features import DEFAULT_N_LAGS, Convention


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument(
        "--artifact",
        default=None,
        help="the TAD artifact (default: the catalog model's committed one, as the server picks it; none for "
        "other models); '' for none: capture then reads what the server captures without one (RAUQ and "
        "Attention Score), at the default lags",
    )
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "tad-serve")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=None)


def artifact_path(args: argparse.Namespace) -> Path | None:
    """The artifact `--artifact` names ('' for none), else the one the server would pick for `--model`."""
    if args.artifact is None:
        return committed_artifact(args.model)
    return Path(args.artifact) if args.artifact else None


def load_capturing_engine(args: argparse.Namespace) -> tuple[LoadedModel, TadArtifact | None, Engine]:
    """The model, its artifact (None for `--artifact ''`) and the engine capturing what the server captures
    with it, but with stop tokens off: every answer runs to exactly the length a benchmark asks for."""
    if args.threads:
        torch.set_num_threads(args.threads)
    path = artifact_path(args)
    artifact = load_artifact(path) if path is not None else None
    loaded = load_model(
        args.model,
        device=args.device,
        dtype=args.dtype,
        cache_dir=args.cache_dir,
        artifact_dtype=artifact.manifest.dtype if artifact is not None else None,
    )
    if artifact is None:
        engine = Engine(loaded, n_lags=DEFAULT_N_LAGS, last_row=False)
    else:
        engine = Engine(loaded, n_lags=artifact.n_lags, last_row=artifact.convention is Convention.CONSUMING)
    engine.context = replace(engine.context, stop_token_ids=frozenset())
    return loaded, artifact, engine


def long_prompt(engine: Engine, tokens: int) -> list[int]:
    """The first `tokens` tokens of a chat prompt made of long_prompt.txt (repeated as often as needed)."""
    text = Path(__file__).with_name("long_prompt.txt").read_text()
    copies = 1
    while True:
        content = "\n\n".join([text] * copies) + "\n\nSummarise the text above."
        ids = engine.encode_prompt(messages=[{"role": "user", "content": content}])
        if len(ids) >= tokens:
            return ids[:tokens]
        copies += 1
