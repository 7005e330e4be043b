"""What attention capture + TAD scoring costs on a GPU, against plain transformers `generate`.

No weights can be downloaded onto a GPU machine, so every model here is randomly initialised
(bf16, built directly on the GPU) from a real model's shape (`benchmarks/random_models.py`):
Llama-3.1-8B, Qwen2.5-7B and, optionally, Gemma-2-9B. Random weights change what is generated, not
what a step costs: every run generates exactly `--new-tokens` tokens (no stop ids, no eos).

`--time` measures, per model and per (batch, prompt length) setting, interleaved in rotating
order after one warm-up run of each method (as long as the timed ones), `--repeats` times:

- plain:   `model.generate` (sdpa attention, greedy, `do_sample=False`), the reference of every ratio;
- engine:  this project's decode loop without capture (`n_lags=0`), what the loop alone costs;
- capture: this project's decode loop with attention capture (`--n-lags`, default 10; the shipped
  generating convention, so no extra step for the last token), then TAD
  scoring of every answer: the real recurrent TAD scorer (`TadScorer`: stage-2 feature rows of
  N x (2 + layers x heads) + 1 values and one dot product per token) with a random linear
  regressor standing in for a trained artifact (same cost), plus `AnswerScorer(None)`'s baselines.

Times are medians (the GPU synchronised around every run); "vs plain" is the median over repeats
of capture's time over plain's in the same repeat. Peak GPU memory is `max_memory_allocated` of
one run (reset before each), weights included. The last line is `worst_ratio=<largest vs plain>`.

`--check` compares, on CUDA in float32 and bfloat16, the attention rows the engine captured while
generating (`SequenceState.attention_rows`) for a small random Llama and Gemma-2 with those of one eager
`output_attentions=True` forward over prompt + answer: the weight from each answer token's query
to the keys 0..N positions before it, split into keys that are generated tokens (all TAD reads),
prompt keys, and slots before the sequence's start (the eager reference has no key there: 0).

Run from the repository root (parts can run in separate calls to stay within a time limit):

    python -m benchmarks.gpu_overhead --check
    python -m benchmarks.gpu_overhead --time --models llama --batches 1 8 32 --prompts 128 2048
    python -m benchmarks.gpu_overhead --time --models qwen gemma2 --budget-s 500
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import transformers
from transformers import (
    Gemma2Config,
    LlamaConfig,
    PretrainedConfig,
)

from app.engine.attention_capture import register_capture_attention
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.uncertainty.answer import AnswerScorer
from benchmarks.random_models import CONFIGS, build_model, id_tokenizer, make_engine, random_tad

PLAIN, ENGINE, CAPTURE = "plain", "engine", "capture"


# ---------------------------------------------------------------------------------------------- timing
def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(run: Callable[[], object]) -> tuple[float, float]:
    """(seconds, peak GiB allocated on the GPU during the run; 0 without one)."""
    synchronize()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    run()
    synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    return time.perf_counter() - started, peak


def empty_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else device


@dataclass
class Row:
    model: str
    batch: int
    prompt: int
    times: dict[str, list[float]] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)
    score_s: list[float] = field(default_factory=list)
    note: str = ""


def time_model(name: str, args: argparse.Namespace, rows: list[Row], started: float) -> None:
    config = CONFIGS[name]()
    if args.layers:
        config.num_hidden_layers = args.layers
        if getattr(config, "layer_types", None) is not None:
            config.layer_types = config.layer_types[: args.layers]
    torch.manual_seed(0)
    build_started = time.perf_counter()
    model = build_model(config, torch.bfloat16, args.device, register_capture_attention())
    synchronize()
    weights_gib = torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
    tokenizer = id_tokenizer(config.vocab_size)
    engine = make_engine(model, tokenizer, name, args.n_lags, fused=args.fused)
    bare = engine.with_lags(0)
    tad = random_tad(config.num_hidden_layers, config.num_attention_heads, args.n_lags)
    baselines = AnswerScorer(None)
    print(
        f"\n## {name}: {config.num_hidden_layers} layers, {config.num_attention_heads} heads, "
        f"{config.num_key_value_heads} kv heads, vocab {config.vocab_size}; weights {weights_gib:.1f} GiB; "
        f"built in {time.perf_counter() - build_started:.1f} s",
        flush=True,
    )
    generator = torch.Generator().manual_seed(0)
    new = args.new_tokens
    for length in args.prompts:
        for batch in args.batches:
            row = Row(name, batch, length)
            rows.append(row)
            if time.perf_counter() - started > args.budget_s:
                row.note = "skipped (time budget)"
                print(f"{name} batch {batch} prompt {length}: skipped, over --budget-s", flush=True)
                continue
            ids = torch.randint(2, config.vocab_size, (batch, length), generator=generator)
            prompts = [tuple(int(i) for i in r) for r in ids.tolist()]
            inputs = ids.to(args.device)

            def plain(tokens: int = new, inputs: torch.Tensor = inputs) -> None:
                with torch.inference_mode():
                    out = model.generate(  # type: ignore[operator]  # torch types module attributes as tensors
                        inputs,
                        attention_mask=torch.ones_like(inputs),
                        max_new_tokens=tokens,
                        do_sample=False,
                        pad_token_id=1,
                    )
                assert out.shape[1] == inputs.shape[1] + tokens, out.shape

            def engine_only(tokens: int = new, prompts: list[tuple[int, ...]] = prompts) -> None:
                requests = [GenerationRequest(p, SamplingParams(max_new_tokens=tokens)) for p in prompts]
                for sequence in bare.generate(requests):
                    assert len(sequence.tokens) == tokens

            def capture(tokens: int = new, prompts: list[tuple[int, ...]] = prompts, row: Row = row) -> None:
                requests = [GenerationRequest(p, SamplingParams(max_new_tokens=tokens)) for p in prompts]
                sequences = engine.generate(requests)
                scoring = time.perf_counter()
                for sequence in sequences:
                    assert len(sequence.tokens) == tokens and len(sequence.attention_rows) >= tokens - 1
                    trace = engine.trace(sequence)
                    confidences = tad.confidences_of(trace)
                    baselines.score(trace, confidences)
                if tokens == new:
                    row.score_s.append(time.perf_counter() - scoring)

            methods: dict[str, Callable[..., None]] = {PLAIN: plain, CAPTURE: capture}
            if args.bare:
                methods[ENGINE] = engine_only
            try:
                for run in methods.values():  # warm-up: kernels, cuBLAS heuristics, cuDNN plans, allocator
                    run(tokens=args.warmup_tokens or new)
                row.score_s.clear()  # a full-length warm-up scored its answers too, cold
                names = list(methods)
                row.times = {m: [] for m in names}
                row.ratios = {m: [] for m in names}
                for repeat in range(args.repeats):
                    order = names[repeat % len(names) :] + names[: repeat % len(names)]
                    this: dict[str, float] = {}
                    for method in order:
                        seconds, peak = timed(methods[method])
                        this[method] = seconds
                        row.memory[method] = max(row.memory.get(method, 0.0), peak)
                    for method, seconds in this.items():
                        row.times[method].append(seconds)
                        row.ratios[method].append(seconds / this[PLAIN])
            except Exception as error:  # report and go on with the other settings
                traceback.print_exc()
                row.note = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
                empty_cache()
            print(format_row(row, new), flush=True)
            if args.profile and not row.note and length == args.prompts[0]:
                profile(f"{name} batch {batch} prompt {length}", methods)


def profile(label: str, methods: dict[str, Callable[..., None]]) -> None:
    """Where a short run's time goes: the top operators by self CPU and by self CUDA time, per method."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for method, run in methods.items():
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run(tokens=16)
            synchronize()
        averages = prof.key_averages()
        print(f"\n### profile {label}, {method}, 16 new tokens", flush=True)
        print(averages.table(sort_by="self_cpu_time_total", row_limit=12), flush=True)
        print(averages.table(sort_by="self_cuda_time_total", row_limit=8), flush=True)
        attention = [a for a in averages if any(word in a.key.lower() for word in ("fmha", "flash", "attention"))]
        for event in attention:  # which attention kernels ran (the capture's log-sum-exp comes from one of them)
            print(f"attention kernel ({method}): {event.key[:110]} x{event.count}", flush=True)


HEADER = (
    "| model | batch | prompt | plain s | plain tok/s | engine s | capture s | capture tok/s | scoring s "
    "| capture/plain | capture/engine | plain GiB | capture GiB |"
)


def format_row(row: Row, new: int) -> str:
    if not row.times or not row.times.get(PLAIN):
        return f"| {row.model} | {row.batch} | {row.prompt} | {row.note} |"
    tokens = row.batch * new
    plain = statistics.median(row.times[PLAIN])
    capture = statistics.median(row.times[CAPTURE])
    ratio = statistics.median(row.ratios[CAPTURE])
    if ENGINE in row.times:
        engine = f"{statistics.median(row.times[ENGINE]):.2f}"
        paired = [c / e for c, e in zip(row.times[CAPTURE], row.times[ENGINE], strict=True)]
        vs_engine = f"{statistics.median(paired):.3f}"
    else:
        engine = vs_engine = "-"
    scoring = f"{statistics.median(row.score_s):.3f}" if row.score_s else "-"
    return (
        f"| {row.model} | {row.batch} | {row.prompt} | {plain:.2f} | {tokens / plain:.0f} | {engine} | {capture:.2f} "
        f"| {tokens / capture:.0f} | {scoring} | {ratio:.3f} | {vs_engine} | {row.memory[PLAIN]:.1f} "
        f"| {row.memory[CAPTURE]:.1f} |{' ' + row.note if row.note else ''}"
    )


# ---------------------------------------------------------------------------------------------- check
def check_configs() -> dict[str, PretrainedConfig]:
    """Small random models for `--check`: Llama (GQA) and Gemma-2 (soft-capping, a sliding window
    shorter than the longest prompt, so full and sliding layers both matter)."""
    shape: dict[str, Any] = {
        "vocab_size": 1000,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 4096,
    }
    llama = LlamaConfig(**shape, tie_word_embeddings=False)
    gemma2 = Gemma2Config(
        **shape,
        query_pre_attn_scalar=32,
        sliding_window=16,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
    )
    return {"llama": llama, "gemma2": gemma2}


def check(args: argparse.Namespace) -> None:
    """Captured rows against eager attention, small random models on CUDA, float32 and bfloat16."""
    n_lags, new = args.n_lags, 12
    device = args.device
    print(f"\n## check: {device_name(device)}, random 2-layer models, 8 heads (2 kv), N={n_lags}")
    print(
        "| model | dtype | generated keys | prompt keys | before start (captured, ref 0) | max ref weight | logprob |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, config in check_configs().items():
        torch.manual_seed(0)
        capture_model = build_model(copy.deepcopy(config), torch.float32, device, register_capture_attention())
        with torch.no_grad():  # peakier attention than the default init, so rows are not all ~1/T
            for layer in capture_model.model.layers:
                layer.self_attn.q_proj.weight.mul_(4.0)
                layer.self_attn.k_proj.weight.mul_(4.0)
            capture_model.lm_head.weight.normal_(0.0, 1.0)
        # Its own config: from_config writes the attention implementation into the config it is given.
        eager_model = build_model(copy.deepcopy(config), torch.float32, device, "eager")
        eager_model.load_state_dict(capture_model.state_dict())
        generator = torch.Generator().manual_seed(1)
        lengths = (20, 3, 40)  # 3: a short prompt, left-padded in the batch, whose early windows reach before it
        prompts = [torch.randint(2, config.vocab_size, (n,), generator=generator).tolist() for n in lengths]
        tokenizer = id_tokenizer(config.vocab_size)
        for dtype in (torch.float32, torch.bfloat16):
            capture_model.to(dtype)  # type: ignore[arg-type]  # transformers' `to` wrapper is typed for devices only
            eager_model.to(dtype)  # type: ignore[arg-type]
            engine = make_engine(capture_model, tokenizer, "check", n_lags, fused=args.fused)
            requests = [GenerationRequest(tuple(p), SamplingParams(max_new_tokens=new)) for p in prompts]
            sequences = engine.generate(requests)
            generated = prompt_keys = before = biggest = logprob = 0.0
            for prompt, sequence in zip(prompts, sequences, strict=True):
                answer = [t.token_id for t in sequence.tokens]
                assert len(answer) == new and len(sequence.attention_rows) >= new - 1
                with torch.no_grad():
                    output = eager_model(torch.tensor([prompt + answer], device=device), output_attentions=True)
                attentions = [a[0].float().cpu().numpy() for a in output.attentions]  # [heads, T, T] each
                log_probs = torch.log_softmax(output.logits[0].float(), dim=-1).cpu()
                for j in range(new):
                    expected_lp = float(log_probs[len(prompt) + j - 1, answer[j]])
                    logprob = max(logprob, abs(sequence.tokens[j].logprob - expected_lp))
                for j, captured in enumerate(sequence.attention_rows):
                    query = len(prompt) + j
                    for back in range(n_lags + 1):
                        key = query - back
                        got = captured[:, :, back]  # [layers, heads]
                        if key < 0:
                            before = max(before, float(np.abs(got).max()))
                            continue
                        expected = np.stack([a[:, query, key] for a in attentions])
                        difference = float(np.abs(got - expected).max())
                        biggest = max(biggest, float(expected.max()))
                        if key >= len(prompt):
                            generated = max(generated, difference)
                        else:
                            prompt_keys = max(prompt_keys, difference)
            print(
                f"| {name} | {str(dtype).removeprefix('torch.')} | {generated:.2e} | {prompt_keys:.2e} | {before:.2e} "
                f"| {biggest:.3f} | {logprob:.2e} |",
                flush=True,
            )
        del capture_model, eager_model
        empty_cache()


# ---------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="captured rows vs eager attention on CUDA")
    parser.add_argument("--time", action="store_true", help="plain generate vs engine with capture + TAD")
    parser.add_argument("--models", nargs="+", choices=sorted(CONFIGS), default=["llama", "qwen"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompts", type=int, nargs="+", default=[128, 2048])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument(
        "--warmup-tokens",
        type=int,
        default=None,
        help="the warm-up run's length (default: --new-tokens; a shorter one leaves cuDNN's attention plans for "
        "the longer keys to the first timed run, plain generate's in the first repeat)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-lags", type=int, default=10)
    parser.add_argument("--bare", action=argparse.BooleanOptionalAction, default=True, help="also time n_lags=0")
    parser.add_argument("--layers", type=int, default=0, help="override the layer count (quick trials)")
    parser.add_argument("--device", default="cuda", help="cpu only for trying the script out")
    parser.add_argument(
        "--fused",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="allow the fused CPU kernel (no effect on CUDA; --no-fused on CPU takes the CUDA code path)",
    )
    parser.add_argument("--budget-s", type=float, default=540.0, help="skip settings that start after this")
    parser.add_argument("--profile", action="store_true", help="torch.profiler tables of one short run per setting")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark is for a GPU machine (benchmarks/overhead.py is the CPU one)")
    started = time.perf_counter()
    print(
        f"device {device_name(args.device)}, torch {torch.__version__}, transformers {transformers.__version__}",
        flush=True,
    )
    if args.check:
        check(args)
    if args.time:
        rows: list[Row] = []
        for name in args.models:
            try:
                time_model(name, args, rows, started)
            except Exception:  # a model that cannot be built or run: report, go on with the next
                traceback.print_exc()
                print(f"{name}: FAILED (trace above)", flush=True)
                torch.cuda.empty_cache()
        print(
            f"\n{args.new_tokens} new tokens, bf16, median of {args.repeats} interleaved repeats, "
            f"capture N={args.n_lags} (generating convention) + TAD scoring\n"
        )
        print(HEADER)
        print("|" + "---|" * (HEADER.count("|") - 1))
        for row in rows:
            print(format_row(row, args.new_tokens))
        ratios = [statistics.median(r.ratios[CAPTURE]) for r in rows if r.ratios.get(CAPTURE)]
        print(f"worst_ratio={max(ratios):.3f}" if ratios else "worst_ratio=nan")


if __name__ == "__main__":
    main()
