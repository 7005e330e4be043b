"""One-off study (docs/experiments/cpu-bf16-tiles.md): bfloat16 products widened a tile at a time, against
whole matrices, on a CPU without fast bfloat16 kernels, with the default model and its artifact.

`--decode`: the first `--batch` answers' prompts of docs/experiments/cpu-bf16-products.json, answered
greedily together (`Engine.generate`, at most `--new-tokens` tokens) with whole-matrix products (the
rule before tiles: from 48 rows, so a batch of decoding rows stays on the reference kernel) and with
tiles, `--runs` times each, interleaved: ms per decode step (the model's forwards of one new token
per row), the answers' tokens and their TAD from the capture during decoding.

`--score`: that page's 36 answers scored teacher-forced (`Engine.score`, batches of 6) with whole
matrices, then with tiles: the seconds of each, and each against the reference kernel's scores stored
there (its rules: decisions at the default threshold, largest and median differences, Spearman).

    python -m benchmarks.cpu_bf16_tiles --decode --runs 3
    python -m benchmarks.cpu_bf16_tiles --score
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr
from torch.nn import functional

from app.engine import cpu_bf16
from app.engine.engine import Engine
from app.engine.loading import load_model
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.settings import DEFAULT_ARTIFACT, Settings
from app.uncertainty.answer import AnswerScorer
from app.uncertainty.artifact import load_artifact

STORED = Path(__file__).resolve().parent.parent / "docs/experiments/cpu-bf16-products.json"


def whole_matrices(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The products before tiles (commit fe12e95): whole matrices widened at the call, from 48 rows."""
    if x.dtype != torch.bfloat16 or x.numel() < cpu_bf16.WHOLE_MATRIX_MIN_ROWS * x.shape[-1]:
        return functional.linear(x, self.weight, self.bias)
    bias = None if self.bias is None else self.bias.float()
    return functional.linear(x.float(), self.weight.float(), bias).to(torch.bfloat16)


def use(model: torch.nn.Module, way: str) -> None:
    forward = whole_matrices if way == "whole" else cpu_bf16._wide_in_float32
    for module in model.modules():
        if "forward" in vars(module):
            module.forward = types.MethodType(forward, module)


class StepClock:
    """Seconds of the model's forwards that add one token per row (decode steps)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.decode: list[float] = []
        self.started = 0.0
        self.one_token = False
        model.register_forward_pre_hook(self.before, with_kwargs=True)
        model.register_forward_hook(self.after)

    def before(self, _: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.one_token = ids is not None and ids.shape[-1] == 1
        self.started = time.perf_counter()

    def after(self, *_: object) -> None:
        if self.one_token:
            self.decode.append(time.perf_counter() - self.started)


def engine_and_scorer() -> tuple[Engine, AnswerScorer, float]:
    if not cpu_bf16.bf16_matmul_is_slow():
        raise SystemExit("this CPU has fast bfloat16 kernels: nothing to compare")
    artifact = load_artifact(DEFAULT_ARTIFACT)
    settings = Settings()
    loaded = load_model(settings.model, device="cpu", dtype="bfloat16", cache_dir=settings.cache_dir)
    assert loaded.wide_bf16_products
    threshold = float(json.loads(STORED.read_text())["threshold"])  # TAD's at the artifact's default target
    engine = Engine(loaded, n_lags=artifact.n_lags, last_row=False, compiled_decode_length=0)
    return engine, AnswerScorer(artifact), threshold


def decode(args: argparse.Namespace) -> None:
    engine, scorer, threshold = engine_and_scorer()
    stored = json.loads(STORED.read_text())
    prompts = [tuple(prompt) for prompt, _ in stored["pairs"][: args.batch]]
    clock = StepClock(engine.loaded.model)
    steps: dict[str, list[float]] = {"whole": [], "tiles": []}
    answers: dict[str, list[tuple[tuple[int, ...], float]]] = {}
    for run in range(args.runs):
        for way in ("whole", "tiles") if run % 2 == 0 else ("tiles", "whole"):
            use(engine.loaded.model, way)
            clock.decode.clear()
            params = SamplingParams(max_new_tokens=args.new_tokens)
            started = time.perf_counter()
            sequences = engine.generate([GenerationRequest(prompt, params) for prompt in prompts])
            seconds = time.perf_counter() - started
            step = statistics.median(clock.decode)
            steps[way].append(step)
            answers[way] = [
                (
                    tuple(t.token_id for t in s.kept_tokens),
                    float(scorer.score(engine.trace(s)).sequence.as_dict()["tad"] or np.nan),
                )
                for s in sequences
            ]
            print(
                f"run {run + 1} {way}: {1000 * step:.0f} ms a decode step (median of {len(clock.decode)}), "
                f"{seconds:.1f} s in all",
                flush=True,
            )
    whole, tiles = statistics.median(steps["whole"]), statistics.median(steps["tiles"])
    print(f"decode step at batch {len(prompts)}: whole matrices {1000 * whole:.0f} ms, tiles {1000 * tiles:.0f} ms, ")
    print(f"speed-up {whole / tiles:.2f}x (medians of {args.runs} runs each)")
    same = [(a, b) for a, b in zip(answers["whole"], answers["tiles"], strict=True) if a[0] == b[0]]
    gaps = [abs(a[1] - b[1]) for a, b in same]
    flips = sum(
        (a[1] <= threshold) != (b[1] <= threshold) for a, b in zip(answers["whole"], answers["tiles"], strict=True)
    )
    print(
        f"answers with the same tokens: {len(same)} of {len(prompts)}; TAD on those: largest difference "
        f"{max(gaps, default=float('nan')):.4f}; decisions differing at {threshold:.3f} (all answers): {flips}"
    )
    for (a, ta), (b, tb) in zip(answers["whole"], answers["tiles"], strict=True):
        if a != b:
            first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            print(f"  differs from token {first} of {len(a)}/{len(b)}: TAD {ta:.4f} / {tb:.4f}")


def score(args: argparse.Namespace) -> None:
    engine, scorer, threshold = engine_and_scorer()
    stored = json.loads(STORED.read_text())
    pairs = [(prompt, answer) for prompt, answer in stored["pairs"]]
    scores: dict[str, list[dict[str, Any]]] = {}
    for way in ("whole", "tiles"):
        use(engine.loaded.model, way)
        started, scores[way] = time.perf_counter(), []
        for start in range(0, len(pairs), 6):
            traces = engine.score(pairs[start : start + 6])
            scores[way] += [scorer.score(trace).sequence.as_dict() for trace in traces]
        print(f"{len(pairs)} answers scored with {way} in {time.perf_counter() - started:.0f} s", flush=True)
    reference = stored["ways"]["bfloat16"]
    print(f"(stored: whole matrices {stored['ways']['bfloat16_wide_products']['seconds']:.0f} s)")
    for way in ("whole", "tiles"):
        print(f"{way} against the reference kernel: method | largest difference | median | Spearman | TAD flips")
        for method in reference["scores"][0]:
            a = np.array([np.nan if s[method] is None else s[method] for s in reference["scores"]], dtype=float)
            b = np.array([np.nan if s[method] is None else s[method] for s in scores[way]], dtype=float)
            both = np.isfinite(a) & np.isfinite(b)
            if both.sum() < 3:
                continue
            gap = np.abs(a[both] - b[both])
            flips = f" | {int(((a[both] <= threshold) != (b[both] <= threshold)).sum())}" if method == "tad" else ""
            rho = spearmanr(a[both], b[both]).statistic
            print(f"  {method} | {gap.max():.4f} | {np.median(gap):.4f} | {rho:.4f}{flips}")
    tad = {way: np.array([s["tad"] for s in scores[way]], dtype=float) for way in scores}
    print(f"TAD, tiles against whole matrices: largest difference {np.nanmax(np.abs(tad['whole'] - tad['tiles'])):.6f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--decode", action="store_true")
    parser.add_argument("--score", action="store_true")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    if args.decode:
        decode(args)
    if args.score:
        score(args)


if __name__ == "__main__":
    main()
