"""The decode step as one CUDA graph (`app/engine/slot_decoding.py`) against the eager loop and plain `generate`.

`--check` (CUDA, float32 and bfloat16, a random 2-layer Llama): sequences of different prompt lengths
decoded in the slots of one batch, the step replayed from a CUDA graph, against each sequence generated
alone by the eager `DecodeBatch`: same tokens, and the max |difference| of log-probs and attention rows;
and against the same slot step run eagerly (what the graph replays: identical up to kernel choice).

`--time` (random bf16 weights of a real shape, exactly `--new-tokens` new tokens, `--batch` prompts of
`--prompt-tokens`): plain transformers `generate` (sdpa) at that batch, the eager engine with capture
(`DecodeBatch`, what the server runs today), and the slot batch with capture, its step replayed from a
CUDA graph (graphs captured in a first untimed run), and the same with inductor's fused kernels recorded in
the graph instead of the eager ones (`InductorGraphBatch`, not in the server yet; `--check` compares it too).
Tokens/s of each, medians of `--repeats`, and the memory-bandwidth limit of a decode step:
`limit = batch x B / W` tokens/s, where W is the weight bytes and B the measured device-to-device copy
bandwidth of a 4 GiB tensor counting bytes read plus written. Last lines:
`inductor_graph_vs_limit=<...>` and `graph_vs_limit=<graph tokens/s / limit>`.

    python -m benchmarks.graph_decode --check
    python -m benchmarks.graph_decode --time --model llama --batch 32 --prompt-tokens 128 --new-tokens 128
"""

from __future__ import annotations

import argparse
import statistics
import traceback
from collections.abc import Callable

import numpy as np
import torch
from transformers import PreTrainedModel

from app.engine.attention_capture import register_capture_attention
from app.engine.decoding import DecodeBatch, run_to_completion
from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest, SequenceState
from app.engine.slot_decoding import SlotDecodeBatch
from benchmarks.gpu_overhead import check_configs, device_name, synchronize, timed
from benchmarks.random_models import CONFIGS, build_model, id_tokenizer, make_engine


class InductorGraphBatch(SlotDecodeBatch):
    """The step compiled by inductor (its small kernels fused), then recorded as a CUDA graph: the lever
    the product's eager-kernel graph lacks for issue 49's bandwidth target. Timed here before it is
    adopted (`--time`, `--check`)."""

    def _graph_step(self, width: int) -> Callable[[], object]:  # type: ignore[override]
        return self._compiled_step(width, cpp_wrapper=False)


def decode_in_slots(engine: Engine, requests: list[GenerationRequest], batch: SlotDecodeBatch) -> list[SequenceState]:
    """Prefill every request at once, decode them in the slots to completion (results in request order)."""
    prefilled = DecodeBatch.prefill(engine.context, requests)
    sequences = list(prefilled.sequences)
    batch.merge(prefilled)
    batch.pop_done()
    while batch.sequences:
        batch.step()
        batch.pop_done()
    return sequences


def copy_bandwidth(gib: int = 4) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus written (median of 5 copies)."""
    source = torch.empty(gib * 2**30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    target.copy_(source)
    seconds = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1000)
    del source, target
    torch.cuda.empty_cache()
    return 2 * gib * 2**30 / statistics.median(seconds)


def _max_difference(a: list[SequenceState], b: list[SequenceState], engine: Engine) -> tuple[bool, float, float]:
    same_tokens, logprob, rows = True, 0.0, 0.0
    for x, y in zip(a, b, strict=True):
        tx, ty = engine.trace(x), engine.trace(y)
        same_tokens &= tx.token_ids == ty.token_ids
        n = min(len(tx.token_ids), len(ty.token_ids))
        logprob = max(logprob, float(np.abs(np.asarray(tx.logprobs[:n]) - np.asarray(ty.logprobs[:n])).max()))
        assert tx.attention is not None and ty.attention is not None
        rows = max(rows, float(np.abs(tx.attention[:n] - ty.attention[:n]).max()))
    return same_tokens, logprob, rows


def check(args: argparse.Namespace) -> None:
    print(
        f"\n## check: {device_name(args.device)}, random 2-layer Llama (8 heads, 2 kv), N={args.n_lags}, 12 new tokens"
    )
    print("| dtype | vs | same tokens | log-prob max diff | rows max diff |")
    print("|---|---|---|---|---|")
    config = check_configs()["llama"]
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        model = build_model(config, dtype, args.device, register_capture_attention())
        engine = make_engine(model, id_tokenizer(config.vocab_size), "llama-check", args.n_lags)
        generator = torch.Generator().manual_seed(1)
        requests = [
            GenerationRequest(
                tuple(torch.randint(2, config.vocab_size, (length,), generator=generator).tolist()),
                SamplingParams(max_new_tokens=12),
            )
            for length in (5, 17, 40)
        ]
        graphed = decode_in_slots(engine, requests, SlotDecodeBatch(engine.context, 4, 256, compiled=True))
        eager_slots = decode_in_slots(engine, requests, SlotDecodeBatch(engine.context, 4, 256, compiled=False))
        alone = [run_to_completion(engine.context, [request])[0] for request in requests]
        for label, reference in (("alone, eager DecodeBatch", alone), ("slots, eager step", eager_slots)):
            same, logprob, rows = _max_difference(graphed, reference, engine)
            print(f"| {str(dtype).removeprefix('torch.')} | {label} | {same} | {logprob:.2e} | {rows:.2e} |")
        try:
            fused = decode_in_slots(engine, requests, InductorGraphBatch(engine.context, 4, 256, compiled=True))
            same, logprob, rows = _max_difference(fused, alone, engine)
            label = "inductor graph vs alone"
            print(f"| {str(dtype).removeprefix('torch.')} | {label} | {same} | {logprob:.2e} | {rows:.2e} |")
        except Exception:  # the variant failing must not lose the product's check above
            traceback.print_exc()


def random_setup(args: argparse.Namespace) -> tuple[PreTrainedModel, Engine, torch.Tensor, list[GenerationRequest]]:
    """The random bf16 model of `--model`'s shape, its engine, `--batch` random prompts and their requests."""
    config = CONFIGS[args.model]()
    if args.layers:
        config.num_hidden_layers = args.layers
    torch.manual_seed(0)
    model = build_model(config, torch.bfloat16, args.device, register_capture_attention())
    engine = make_engine(model, id_tokenizer(config.vocab_size), args.model, args.n_lags)
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, config.vocab_size, (args.batch, args.prompt_tokens), generator=generator)
    requests = [
        GenerationRequest(tuple(row.tolist()), SamplingParams(max_new_tokens=args.new_tokens)) for row in prompts
    ]
    return model, engine, prompts, requests


def time_decoding(args: argparse.Namespace) -> None:
    model, engine, prompts, requests = random_setup(args)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    length = args.prompt_tokens + args.new_tokens + 8
    slots = SlotDecodeBatch(engine.context, args.batch, length, compiled=True)
    in_step = SlotDecodeBatch(engine.context, args.batch, length, compiled=True, lookahead=False)
    inputs = prompts.to(args.device)

    def plain() -> None:
        with torch.inference_mode():
            model.generate(  # type: ignore[operator]
                inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens, do_sample=False,
            )  # fmt: skip

    # The limit first: a later step past its time limit must not take it (and the rows before) with it.
    bandwidth = copy_bandwidth() if args.device == "cuda" else float("nan")
    limit = args.batch * bandwidth / weight_bytes
    print(
        f"\n## time: {device_name(args.device)}, {args.model} shape, bf16, batch {args.batch}, "
        f"prompt {args.prompt_tokens}, {args.new_tokens} new tokens, N={args.n_lags}, medians of {args.repeats}\n"
        f"weights {weight_bytes / 1e9:.2f} GB, copy bandwidth {bandwidth / 1e12:.2f} TB/s, limit {limit:,.0f} tokens/s",
        flush=True,
    )
    methods: dict[str, Callable[[], object]] = {"plain generate": plain}
    if args.variants in ("product", "all"):
        methods["engine, eager (capture)"] = lambda: run_to_completion(engine.context, requests)
        methods["slots, CUDA graph, results read in the step (capture)"] = lambda: decode_in_slots(
            engine, requests, in_step
        )
        methods["slots, CUDA graph (capture)"] = lambda: decode_in_slots(engine, requests, slots)
    if args.variants in ("inductor", "all"):
        fused = InductorGraphBatch(engine.context, args.batch, length, compiled=True)
        methods["slots, inductor's kernels in a CUDA graph (capture)"] = lambda: decode_in_slots(
            engine, requests, fused
        )
    for name, run in list(methods.items()):  # warm-up; the slot batch captures its graphs here
        try:
            run()
        except Exception:  # one method failing must not lose the others' numbers
            traceback.print_exc()
            print(f"{name} failed; left out")
            del methods[name]
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):
        for name, run in methods.items():
            seconds[name].append(timed(run)[0])
    tokens = args.batch * args.new_tokens
    print("| method | s | tokens/s | vs plain | vs limit |")
    print("|---|---|---|---|---|")
    plain_s = statistics.median(seconds["plain generate"])
    rates = {}
    for name, values in seconds.items():
        median = statistics.median(values)
        rates[name] = tokens / median
        print(f"| {name} | {median:.3f} | {rates[name]:,.0f} | {plain_s / median:.2f} | {rates[name] / limit:.2f} |")
    synchronize()
    if args.variants in ("inductor", "all"):
        fused_rate = rates.get("slots, inductor's kernels in a CUDA graph (capture)", float("nan"))
        print(f"inductor_graph_vs_limit={fused_rate / limit:.3f}")
    if args.variants in ("product", "all"):
        print(f"graph_vs_limit={rates.get('slots, CUDA graph (capture)', float('nan')) / limit:.3f}")


def profile_step(args: argparse.Namespace) -> None:
    """Where a replayed step's GPU time goes: kernels of `--profile-steps` replays, by total time."""
    from torch.profiler import ProfilerActivity, profile

    _, engine, _, requests = random_setup(args)
    batch = SlotDecodeBatch(engine.context, args.batch, args.prompt_tokens + args.new_tokens + 8, compiled=True)
    batch.merge(DecodeBatch.prefill(engine.context, requests))
    for _ in range(3):  # the graph is captured at the first
        batch.step()
    synchronize()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as profiled:
        for _ in range(args.profile_steps):
            batch.step()
        synchronize()
    events = [e for e in profiled.key_averages() if e.device_time_total > 0]
    total = sum(e.device_time_total for e in events if e.device_type.name == "CUDA")
    kernels = sum(e.count for e in events if e.device_type.name == "CUDA")
    print(f"\n## profile: {args.profile_steps} replayed steps, batch {args.batch}")
    steps = args.profile_steps
    print(f"GPU time per step {total / steps / 1000:.2f} ms, kernels per step {kernels / steps:.0f}")
    print(profiled.key_averages().table(sort_by="device_time_total", row_limit=25, max_name_column_width=70))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--time", action="store_true")
    parser.add_argument("--model", choices=sorted(CONFIGS), default="llama")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--n-lags", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--variants",
        choices=("product", "inductor", "all"),
        default="all",
        help="--time: the product's loops (eager, CUDA graph), inductor's kernels in a graph (compiled at the first "
        "run: minutes for an 8B shape on a cold cache), or both; plain generate always",
    )
    parser.add_argument("--profile", action="store_true", help="kernels of a few replayed steps (torch.profiler)")
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--device", default="cuda", help="cpu only to try the script out (no graph there)")
    parser.add_argument("--layers", type=int, default=0, help="override the layer count (quick trials)")
    args = parser.parse_args()
    if args.check:
        check(args)
    if args.time:
        time_decoding(args)
    if args.profile:
        profile_step(args)


if __name__ == "__main__":
    main()
