"""What TAD's attention capture costs, against plain generation and the alternatives, on the default model.

In one process and interleaved (so machine noise hits every method alike), it times:

- plain:    transformers' `generate` with sdpa attention, the reference of every ratio;
- engine:   this engine's decode loop without capture (what the loop itself costs);
- capture:  this engine with attention capture and TAD scoring of every token (with `--artifact ''`, the
            capture the server does without an artifact, and every free score, RAUQ included);
- eager:    transformers' `generate` with eager attention and `output_attentions=True`;
- extra:    plain `generate`, then the paper's extra teacher-forced forward with eager attentions;

at batch 1 and 8 with a short prompt and at batch 1 with a ~1,000-token prompt, each for
exactly --new-tokens tokens. Prints medians, tokens/s, peak memory (RSS above the idle
process, sampled every 2 ms in a separate untimed pass) and ratios (median over repeats of
the method's time over plain's time in the same repeat; "vs engine" likewise over the
engine without capture, which isolates what capture and scoring add); the last line is
`overhead_ratio=<worst capture/plain ratio of the three settings>`.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM

from app.engine.engine import Engine
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.uncertainty.answer import AnswerScorer
from benchmarks.default_engine import add_model_arguments, load_capturing_engine, long_prompt

PAGE = 4096
PLAIN = "plain (transformers generate)"
ENGINE = "plain (engine, no capture)"
CAPTURE = "capture + TAD"
_LIBC = ctypes.CDLL("libc.so.6")


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


class PeakMemory:
    """Peak RSS above the level at entry, sampled in a background thread."""

    def __enter__(self) -> PeakMemory:
        gc.collect()
        _LIBC.malloc_trim(0)
        self.base = rss_bytes()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def delta_mb(self) -> float:
        return (self.peak - self.base) / 2**20


@dataclass
class Setting:
    name: str
    prompts: list[list[int]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--slow-repeats", type=int, default=3, help="repeats of the eager and extra-forward runs")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--long-tokens", type=int, default=1024)
    args = parser.parse_args()

    loaded, artifact, capture = load_capturing_engine(args)  # stop tokens off: always exactly --new-tokens
    plain_engine = capture.with_lags(0)
    scorer = AnswerScorer(artifact)
    model_dir = str(loaded.model.name_or_path)
    device, dtype = loaded.device, loaded.model.dtype
    sdpa = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    eager = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager")
    for model in (sdpa, eager):
        model.to(device).eval()  # type: ignore[arg-type]  # transformers' `to` wrapper is typed for dtypes only
    pad = capture.context.pad_token_id
    new = args.new_tokens
    short = capture.encode_prompt(messages=[{"role": "user", "content": "Write a short story about a cat."}])
    settings = [
        Setting("batch 1, short prompt", [short]),
        Setting("batch 8, short prompt", [short] * 8),
        Setting(f"batch 1, {args.long_tokens}-token prompt", [long_prompt(capture, args.long_tokens)]),
    ]

    def batch_inputs(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        return ids, mask

    def hf_generate(model: torch.nn.Module, prompts: list[list[int]], **extra: object) -> torch.Tensor:
        ids, mask = batch_inputs(prompts)
        with torch.inference_mode():
            out = model.generate(  # type: ignore[operator]  # torch types module attributes as tensors
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=pad,
                **extra,
            )
        return out if isinstance(out, torch.Tensor) else out.sequences

    def engine_generate(engine: Engine, prompts: list[list[int]], score: bool) -> None:
        requests = [GenerationRequest(tuple(p), SamplingParams(max_new_tokens=new)) for p in prompts]
        for sequence in engine.generate(requests):
            assert len(sequence.tokens) == new
            if score:
                scored = scorer.score(engine.trace(sequence))
                assert artifact is None or (scored.confidences is not None and len(scored.confidences) == new)

    def extra_forward(prompts: list[list[int]]) -> None:
        sequences = hf_generate(sdpa, prompts)
        _, prompt_mask = batch_inputs(prompts)
        mask = torch.cat([prompt_mask, torch.ones_like(sequences[:, prompt_mask.shape[1] :])], dim=1)
        with torch.inference_mode():
            eager(input_ids=sequences, attention_mask=mask, output_attentions=True)

    methods: dict[str, Callable[[list[list[int]]], object]] = {
        PLAIN: lambda p: hf_generate(sdpa, p),
        ENGINE: lambda p: engine_generate(plain_engine, p, score=False),
        CAPTURE: lambda p: engine_generate(capture, p, score=True),
        "eager output_attentions": lambda p: hf_generate(
            eager, p, output_attentions=True, return_dict_in_generate=True
        ),
        "extra forward pass": extra_forward,
    }
    for setting in settings:  # warm-up
        for run in methods.values():
            run(setting.prompts[:1])
    # Per run the shared machine's noise is about +-10%, so the three methods the ratio compares
    # run many times, back to back and in rotating order; the slow alternatives run fewer times.
    core = [PLAIN, ENGINE, CAPTURE]
    slow = [m for m in methods if m not in core]
    times: dict[tuple[str, str], list[float]] = {(s.name, m): [] for s in settings for m in methods}
    # A method's time over plain's, and over the engine without capture's, in the same repeat.
    paired: dict[tuple[str, str], list[float]] = {(s.name, m): [] for s in settings for m in methods}
    paired_engine: dict[tuple[str, str], list[float]] = {(s.name, m): [] for s in settings for m in methods}
    for repeat in range(args.repeats):
        order = core[repeat % len(core) :] + core[: repeat % len(core)]
        if repeat < args.slow_repeats:
            order += slow
        for setting in settings:
            this_repeat = {}
            for name in order:
                started = time.perf_counter()
                methods[name](setting.prompts)
                this_repeat[name] = time.perf_counter() - started
            for name, seconds in this_repeat.items():
                times[(setting.name, name)].append(seconds)
                paired[(setting.name, name)].append(seconds / this_repeat[PLAIN])
                paired_engine[(setting.name, name)].append(seconds / this_repeat[ENGINE])
        print(f"repeat {repeat + 1}/{args.repeats} done", flush=True)
    # Memory in its own pass: the sampling thread would otherwise steal CPU from the timed runs.
    memory = {}
    for setting in settings:
        for name, run in methods.items():
            with PeakMemory() as peak:
                run(setting.prompts)
            memory[(setting.name, name)] = peak.delta_mb

    print(
        f"\nmodel {loaded.identity.name} on {device} ({str(dtype).removeprefix('torch.')}), "
        f"{torch.get_num_threads()} threads, {new} new tokens, {args.repeats} interleaved repeats "
        f"({args.slow_repeats} for eager and extra), TAD artifact: "
        f"{artifact.path if artifact is not None else 'none (RAUQ and Attention Score only)'}, N={capture.n_lags}"
    )
    print(
        f"{'setting':<28} {'method':<30} {'median s':>9} {'tokens/s':>9} {'peak MB':>8} {'vs plain':>9} "
        f"{'vs engine':>10}"
    )
    worst = 0.0
    for setting in settings:
        tokens = new * len(setting.prompts)
        for name in methods:
            median = statistics.median(times[(setting.name, name)])
            ratio = statistics.median(paired[(setting.name, name)])
            ratio_engine = statistics.median(paired_engine[(setting.name, name)])
            print(
                f"{setting.name:<28} {name:<30} {median:>9.3f} {tokens / median:>9.1f} "
                f"{memory[(setting.name, name)]:>8.0f} {ratio:>8.2f}x {ratio_engine:>9.2f}x"
            )
        worst = max(worst, statistics.median(paired[(setting.name, CAPTURE)]))
    print(f"overhead_ratio={worst:.3f}")


if __name__ == "__main__":
    main()
