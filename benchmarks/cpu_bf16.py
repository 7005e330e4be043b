"""bfloat16 on a CPU without fast bfloat16 kernels: speed of one product, and the artifact's scores three ways.

`--products`: one linear layer of the default model's MLP shape (1536 x 8960) at 1 to 512 rows, in
bfloat16 (the kernel torch picks here), float32, and bfloat16 weights widened to float32 at the call
(`app/engine/cpu_bf16.py`), ms per product, median of `--repeats`.

Otherwise: the first `--per-dataset` dev records of six datasets, asked in chat style, answered greedily
(at most `--new-tokens` tokens) by the model in float32, then each answer scored teacher-forced
(`Engine.score`) by the model in float32, in bfloat16 with its wide products in float32, and in bfloat16
with torch's own kernels (the numbers the artifact was fitted on), each scored by the artifact: per
method the largest and median difference from the last, Spearman's rank correlation with it, TAD's
decisions at the artifact's default threshold that differ, and each way's scoring seconds. The answers
and scores go to `--out` (JSON), so `--report` prints the comparison again without the model.

    python -m benchmarks.cpu_bf16 --products
    python -m benchmarks.cpu_bf16 --per-dataset 6 --out runs/cpu-bf16.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.stats import spearmanr
from torch.nn import functional

from app.engine.cpu_bf16 import bf16_matmul_is_slow, widen_bf16_products
from app.engine.engine import Engine
from app.engine.loading import load_model
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.settings import DEFAULT_ARTIFACT, Settings
from app.uncertainty.answer import AnswerScorer
from app.uncertainty.artifact import load_artifact
from training.data import read_records
from training.tasks import PromptStyle, build_messages

DATASETS = ("squad", "mmlu", "truthfulqa", "triviaqa", "nq_open", "gsm8k")
REFERENCE = "bfloat16"
WAYS = ("float32", "bfloat16_wide_products", REFERENCE)


def time_products(repeats: int) -> None:
    weight = (torch.randn(8960, 1536) * 0.02).bfloat16()
    layer = torch.nn.Linear(1536, 8960, bias=False, dtype=torch.bfloat16)
    layer.weight.data = weight
    widened = torch.nn.Linear(1536, 8960, bias=False, dtype=torch.bfloat16)
    widened.weight.data = weight
    widen_bf16_products(widened)
    wide_f32 = weight.float()
    print(f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    print("rows | bfloat16 ms | float32 ms | widened ms")
    for rows in (1, 8, 32, 48, 64, 128, 512):
        x = torch.randn(rows, 1536).bfloat16()
        runs = {
            "bfloat16": lambda x=x: functional.linear(x, weight),
            "float32": lambda x=x: functional.linear(x.float(), wide_f32),
            "widened": lambda x=x: widened(x),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(repeats + 1):  # the first round warms up
            for name, run in runs.items():
                started = time.perf_counter()
                run()
                times[name].append(1000 * (time.perf_counter() - started))
        medians = [statistics.median(values[1:]) for values in times.values()]
        print(f"{rows} | " + " | ".join(f"{value:.1f}" for value in medians))


def engine_for(settings: Settings, dtype: str, n_lags: int, wide: bool) -> Engine:
    loaded = load_model(settings.model, device="cpu", dtype=dtype, cache_dir=settings.cache_dir, widen_slow_bf16=False)
    if wide:
        widen_bf16_products(loaded.model)
    return Engine(loaded, n_lags=n_lags, last_row=False, compiled_decode_length=0)


def score_all(engine: Engine, scorer: AnswerScorer, pairs: list[tuple[list[int], list[int]]]) -> dict[str, Any]:
    started, scores = time.perf_counter(), []
    for start in range(0, len(pairs), 6):
        scores += [scorer.score(trace).sequence.as_dict() for trace in engine.score(pairs[start : start + 6])]
    return {"scores": scores, "seconds": time.perf_counter() - started}


def collect(args: argparse.Namespace) -> dict[str, Any]:
    artifact = load_artifact(args.artifact)
    scorer, settings = AnswerScorer(artifact), Settings()
    files = [args.data / f"{name}_dev.jsonl" for name in DATASETS]
    records = list(read_records(files, limit=args.per_dataset))
    engine = engine_for(settings, "float32", artifact.n_lags, wide=False)
    prompts = [engine.encode_prompt(messages=build_messages(r.record, PromptStyle.CHAT)) for r in records]
    answers: list[tuple[int, ...]] = []
    for start in range(0, len(prompts), 12):
        params = SamplingParams(max_new_tokens=args.new_tokens)
        requests = [GenerationRequest(tuple(p), params) for p in prompts[start : start + 12]]
        answers += [tuple(t.token_id for t in s.kept_tokens) for s in engine.generate(requests)]
        print(f"answered {len(answers)} of {len(prompts)}", flush=True)
    pairs = [(list(p), list(a)) for p, a in zip(prompts, answers, strict=True) if a]
    result: dict[str, Any] = {"pairs": pairs, "threshold": default_threshold(artifact), "ways": {}}
    for way in WAYS:
        if way != "float32":
            del engine
            gc.collect()
            engine = engine_for(settings, "bfloat16", artifact.n_lags, wide=way != REFERENCE)
        result["ways"][way] = score_all(engine, scorer, pairs)
        print(f"scored {way} in {result['ways'][way]['seconds']:.0f} s", flush=True)
        args.out.write_text(json.dumps(result))
    return result


def default_threshold(artifact: Any) -> float:
    manifest = artifact.manifest
    return float(manifest.thresholds["tad"][manifest.default_target].threshold)


def report(result: dict[str, Any]) -> None:
    ways = result["ways"]
    reference = ways[REFERENCE]
    threshold = result["threshold"]
    seconds = ", ".join(f"{way} {value['seconds']:.0f}" for way, value in ways.items())
    print(f"{len(result['pairs'])} answers; scoring seconds: {seconds}")
    for way, other in ways.items():
        if way == REFERENCE:
            continue
        print(f"{way} against {REFERENCE}: method | largest difference | median | Spearman | TAD decisions differing")
        for method in reference["scores"][0]:
            a = np.array([np.nan if s[method] is None else s[method] for s in reference["scores"]], dtype=float)
            b = np.array([np.nan if s[method] is None else s[method] for s in other["scores"]], dtype=float)
            both = np.isfinite(a) & np.isfinite(b)
            if both.sum() < 3:
                continue
            gap = np.abs(a[both] - b[both])
            flips = int(((a[both] <= threshold) != (b[both] <= threshold)).sum()) if method == "tad" else None
            rho = spearmanr(a[both], b[both]).statistic
            flipped = "" if flips is None else f" | {flips} of {int(both.sum())}"
            print(f"  {method} | {gap.max():.4f} | {np.median(gap):.4f} | {rho:.4f}{flipped}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--products", action="store_true", help="time one product instead")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--per-dataset", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    parser.add_argument("--out", type=Path, default=Path("runs/cpu-bf16.json"))
    parser.add_argument("--report", action="store_true", help="print the comparison in --out again")
    args = parser.parse_args()
    if args.products:
        time_products(args.repeats)
        return
    if not bf16_matmul_is_slow():
        print("note: this CPU has fast bfloat16 kernels; the widened products are not what the server runs here")
    if args.report:
        report(json.loads(args.out.read_text()))
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report(collect(args))


if __name__ == "__main__":
    main()
