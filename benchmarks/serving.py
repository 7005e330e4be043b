"""The service against plain `generate`: C concurrent HTTP clients against `generate` at batch C, in one process.

The service is the real app under uvicorn: continuous batching, attention capture, the per-token
statistics, every answer scored (TAD where the artifact has a regressor, and the baselines) and
decided by the policy (whatever method the artifact decides with). Plain transformers `generate`
runs at batch `--clients` on the same model object in the same server process, between the
service's timed windows, with prompts of the same length (the warm-up round's) and the same answer
lengths. On CPU a tiny model makes the forward cheap, so the Python around it dominates, as on a GPU.

`--model` is a config with random weights (`tiny-llama`, a host-bound model for CPU: 4 layers x 4
heads, hidden 64, vocabulary 2,048; or `llama`, `qwen`, `gemma2`: the real shapes of
`benchmarks/gpu_overhead.py`, bf16 on CUDA), with a random artifact of its shape (stage 2 `--stage2`);
or a real model (a catalog name such as `smollm2-135m` or `qwen2.5-coder-1.5b`, or any model spec)
with `--artifact` (a folder, or `none`). Stop tokens are off on both sides, so every answer has
exactly `--new-tokens` tokens.

One command, two processes: this one starts `--role server` (`benchmarks/serving_server.py`) and,
once `/ready` answers, sends a warm-up round, then alternates plain `generate` (timed in the server
on the same number of tokens as a window: `--requests` / `--clients` batches back to back) with
`--repeats` windows of `--requests` requests from `--clients` threads, each sending its next
request when the last one is answered. The ratio of a window is the service's tokens/s over it
against the mean of the `generate` runs just before and after it (the speed of a shared machine
drifts); the last line is `scheduler_vs_generate=<median ratio>`. Also printed: latency percentiles and, unless
`--no-phases`, the worker's host time per decode step by phase (`app/engine/phase_timing.py`,
`TAD_PHASE_TIMING=1` in the server), the CPU time of the event loop's thread (HTTP, streaming,
decisions) and of the worker per step, and `generate`'s time per step with its forward's share.

With `--no-http` the window's requests are sent inside the server instead, by `--clients` tasks on its
event loop calling the service as a route does (`POST /bench/window`): no HTTP, JSON or middleware
sharing the worker's GIL and cores, so the ratio then bounds what taking the HTTP side out of the
worker's process could give.

    python -m benchmarks.serving --model tiny-llama --device cpu --clients 32
    python -m benchmarks.serving --model smollm2-135m --device cpu --clients 8 --prompt-tokens 64 --new-tokens 64
    python -m benchmarks.serving --model llama --clients 32 --requests 128
    python -m benchmarks.serving --model llama --clients 32 --requests 128 --stage2 mlp+ridge --stream
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.engine.phase_timing import IDLE, PHASES
from app.settings import DEFAULT_ARTIFACT

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Answer:
    seconds: float
    tokens: int
    method: str
    scored: bool
    confident_tokens: int = 0  # streamed token events that carried a TAD confidence


def rate(generate: dict[str, float]) -> float:
    return generate["tokens"] / generate["seconds"]


@dataclass
class Window:
    """One repeat: the service's window, between the two `generate` runs around it."""

    seconds: float
    answers: list[Answer]
    before: dict[str, Any]
    after: dict[str, Any]
    client_cpu_seconds: float  # this process's (the HTTP clients'): on one machine they share the server's cores
    generate: tuple[dict[str, float], dict[str, float]] = ({}, {})  # the runs before and after the window

    @property
    def generate_tokens_per_s(self) -> float:
        """The mean of the two runs' rates: drift in the machine's speed then hits both sides alike."""
        return (rate(self.generate[0]) + rate(self.generate[1])) / 2

    @property
    def ratio(self) -> float:
        return self.tokens_per_s / self.generate_tokens_per_s

    @property
    def tokens_per_s(self) -> float:
        return sum(answer.tokens for answer in self.answers) / self.seconds


class Client:
    def __init__(self, args: argparse.Namespace, url: str) -> None:
        self.args = args
        self.url = url
        self.http = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=args.clients + 4))

    def body(self, prompt: str) -> dict[str, Any]:
        return {
            "prompt": prompt,
            "max_new_tokens": self.args.new_tokens,
            "return_tokens": False,
            "stream": self.args.stream,
        }

    def one(self, prompt: str) -> Answer:
        started = time.perf_counter()
        confident = 0
        if self.args.stream:
            result, confident = self._streamed(self.body(prompt))
        else:
            result = self._whole(self.body(prompt))
        decision = result["decision"]
        if result["usage"]["prompt_tokens"] != self.args.prompt_tokens:
            raise SystemExit(f"prompt of {result['usage']['prompt_tokens']} tokens, not {self.args.prompt_tokens}")
        if result["usage"]["completion_tokens"] != self.args.new_tokens:
            raise SystemExit(f"an answer of {result['usage']['completion_tokens']} tokens, not {self.args.new_tokens}")
        return Answer(
            seconds=time.perf_counter() - started,
            tokens=int(result["usage"]["completion_tokens"]),
            method=str(decision["method"]),
            scored=decision["score"] is not None,
            confident_tokens=confident,
        )

    def _whole(self, body: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post(f"{self.url}/v1/generate", json=body)
        if response.status_code != 200:
            raise SystemExit(f"request failed: {response.status_code} {response.text[:300]}")
        result: dict[str, Any] = response.json()
        return result

    def _streamed(self, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """The `final` event's response, after checking one `token` event per token, and how many of those
        events carried a TAD confidence (all of them where the artifact has a regressor)."""
        tokens, confident, event = 0, 0, ""
        with self.http.stream("POST", f"{self.url}/v1/generate", json=body) as response:
            if response.status_code != 200:
                raise SystemExit(f"request failed: {response.status_code} {response.read()[:300]!r}")
            for line in response.iter_lines():
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: ") and event == "token":
                    tokens += 1
                    confident += json.loads(line.removeprefix("data: "))["confidence"] is not None
                elif line.startswith("data: ") and event == "final":
                    final: dict[str, Any] = json.loads(line.removeprefix("data: "))
                    if tokens != final["usage"]["completion_tokens"]:
                        raise SystemExit(f"{tokens} token events for {final['usage']['completion_tokens']} tokens")
                    return final, confident
        raise SystemExit("the stream ended without its final event")

    def in_server(self, prompts: list[str]) -> list[Answer]:
        """`--no-http`: the window's requests sent inside the server, by `--clients` tasks on its event loop."""
        body = {"prompts": prompts, "clients": self.args.clients, "new_tokens": self.args.new_tokens}
        response = self.http.post(f"{self.url}/bench/window", json=body)
        if response.status_code != 200:
            raise SystemExit(f"window failed: {response.status_code} {response.text[:300]}")
        answers, wanted = [], (self.args.prompt_tokens, self.args.new_tokens)
        for result in response.json()["answers"]:
            if (result["prompt_tokens"], result["completion_tokens"]) != wanted:
                raise SystemExit(f"an answer of {result['completion_tokens']} tokens to {result['prompt_tokens']}")
            answers.append(Answer(result["seconds"], result["completion_tokens"], result["method"], result["scored"]))
        return answers

    def generate(self, split: bool) -> dict[str, float]:
        """Plain `generate` on as many tokens as a window: `--requests` / `--clients` batches back to back."""
        batches = max(1, self.args.requests // self.args.clients)
        result: dict[str, float] = self.http.post(
            f"{self.url}/bench/generate", params={"batches": batches, "split": split}
        ).json()
        return result

    def window(self, pool: ThreadPoolExecutor, prompts: list[str]) -> Window:
        before = self.http.post(f"{self.url}/bench/reset").json()
        started, cpu_started = time.perf_counter(), time.process_time()
        if self.args.http:
            answers = list(pool.map(self.one, prompts))
        else:
            answers = self.in_server(prompts)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        after = self.http.get(f"{self.url}/bench/phases").json()
        return Window(seconds=seconds, answers=answers, before=before, after=after, client_cpu_seconds=cpu)


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.stderr.write(log.read_text()[-3000:])
            raise SystemExit(f"server exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise SystemExit("server not ready in time")


def run(args: argparse.Namespace) -> list[Window]:
    """Start the server, warm it up, time `--repeats` windows."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TAD_PHASE_TIMING": "1" if args.phases else "0"}
    log = Path(tempfile.gettempdir()) / f"serving-benchmark-{args.port}.log"
    command = [sys.executable, "-m", "benchmarks.serving", "--role", "server", *sys.argv[1:]]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_ready(url, process, args.ready_timeout, log)
        client = Client(args, url)
        prompts: list[str] = client.http.get(f"{url}/bench/prompts").json()["prompts"]
        windows = []
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(client.one, prompts[: args.clients]))  # warm-up
            generated = client.generate(split=False)
            for repeat in range(args.repeats):
                offset = args.clients + repeat * args.requests
                window = client.window(pool, [prompts[(offset + i) % len(prompts)] for i in range(args.requests)])
                # The last run also times generate's forwards apart (hooks, in a run of its own).
                after = client.generate(split=args.phases and repeat == args.repeats - 1)
                window.generate, generated = (generated, after), after
                windows.append(window)
                print(
                    f"repeat {repeat + 1}/{args.repeats}: service {window.tokens_per_s:.1f} tokens/s, generate "
                    f"{rate(window.generate[0]):.1f} before and {rate(after):.1f} after, ratio {window.ratio:.3f}",
                    flush=True,
                )
    finally:
        process.terminate()
        process.wait(60)
    print(f"(server log: {log})")
    return windows


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(args: argparse.Namespace, windows: list[Window]) -> None:
    info = windows[-1].after
    answers = [answer for window in windows for answer in window.answers]
    latencies = [answer.seconds for answer in answers]
    methods = Counter(answer.method for answer in answers)
    generate_rates = [w.generate_tokens_per_s for w in windows]
    print(
        f"\n{info['model']} on {info['device']}, {info['torch_threads']} torch threads, artifact {info['artifact']}; "
        f"{args.clients} clients ({'streaming' if args.stream else 'whole answers'}"
        f"{'' if args.http else ', in the server without HTTP'}), {args.requests} requests a "
        f"window, {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, {len(windows)} repeats, "
        f"prefill budget {info['prefill_chunk_tokens'] or 'whole prompts'}"
    )
    print(
        f"service: {statistics.median(w.tokens_per_s for w in windows):.1f} tokens/s (median of windows; "
        f"latency p50 {percentile(latencies, 0.5):.2f} s, p90 {percentile(latencies, 0.9):.2f} s, "
        f"p99 {percentile(latencies, 0.99):.2f} s); decided by {dict(methods)}, every answer scored: "
        f"{all(answer.scored for answer in answers)}"
        + (
            f"; streamed tokens with a TAD confidence: {sum(a.confident_tokens for a in answers)} of "
            f"{sum(a.tokens for a in answers)}"
            if args.stream
            else ""
        )
    )
    print(
        f"generate at batch {args.clients}: {statistics.median(generate_rates):.1f} tokens/s (median over the "
        f"windows of the runs before and after each)"
    )
    print("ratio per repeat: " + " ".join(f"{w.ratio:.3f}" for w in windows))
    if args.phases:
        print_phases(args, windows)
    print(f"scheduler_vs_generate={statistics.median(w.ratio for w in windows):.3f}")


def print_phases(args: argparse.Namespace, windows: list[Window]) -> None:
    """Host time per decode step, summed over the windows."""
    steps = sum(w.after["phases"]["decode_steps"] for w in windows)
    if not steps:
        return
    seconds = {phase: sum(w.after["phases"]["seconds"].get(phase, 0.0) for w in windows) for phase in PHASES}
    busy = sum(value for phase, value in seconds.items() if phase != IDLE)

    def cpu(thread: str) -> float:
        return sum(w.after["cpu"].get(thread, 0.0) - w.before["cpu"].get(thread, 0.0) for w in windows)

    wall = sum(w.after["wall"] - w.before["wall"] for w in windows)
    rows = sum(w.after["phases"].get("decode_rows", 0) for w in windows)
    print(
        f"\nservice, host time per decode step ({steps} steps, {steps / len(windows):.0f} a window, "
        f"{rows / steps:.1f} rows a step on average), ms:"
    )
    for phase in PHASES:
        if phase != IDLE:
            print(f"  {phase:<22} {1000 * seconds[phase] / steps:8.3f}  {100 * seconds[phase] / busy:5.1f}%")
    print(f"  {'worker, busy':<22} {1000 * busy / steps:8.3f}")
    print(f"  {'worker, idle':<22} {1000 * seconds[IDLE] / steps:8.3f}")
    print(f"  {'worker CPU':<22} {1000 * cpu('tad-scheduler') / steps:8.3f}")
    print(f"  {'event loop CPU (HTTP)':<22} {1000 * cpu('event_loop') / steps:8.3f}")
    print(f"  {'process CPU':<22} {1000 * cpu('process') / steps:8.3f}  (all threads, torch's included)")
    print(f"  {'wall':<22} {1000 * wall / steps:8.3f}")
    client = sum(w.client_cpu_seconds for w in windows)
    print(f"  {'client process CPU':<22} {1000 * client / steps:8.3f}  (the HTTP clients, on the same machine)")
    split = [g for w in windows for g in w.generate[1:] if "split_seconds" in g]
    if split:
        total = sum(g["split_seconds"] for g in split)
        forward = sum(g["split_forward_seconds"] for g in split)
        per_step = 1000 / (args.new_tokens * len(split))
        print(
            f"generate, per step (a run with its forwards timed), ms: total {total * per_step:.3f}, "
            f"forward {forward * per_step:.3f}, the rest {(total - forward) * per_step:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", choices=["client", "server"], default="client")
    parser.add_argument(
        "--model",
        default="llama",
        help="tiny-llama, llama, qwen, gemma2 (random weights), or a real model: a catalog name or model spec",
    )
    parser.add_argument(
        "--artifact",
        default=str(DEFAULT_ARTIFACT),
        help="a real model's artifact folder, or none (default: %(default)s)",
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto", help="auto: bf16 on CUDA and float32 on CPU for random weights")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=0, help="requests per timed window (default 4 x clients)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--n-lags", type=int, default=10)
    parser.add_argument(
        "--stage2", choices=("ridge", "mlp", "mlp+ridge"), default="ridge", help="the random artifact's stage 2"
    )
    parser.add_argument("--stream", action="store_true", help="clients stream (each token scored as it is sampled)")
    parser.add_argument(
        "--no-phases", dest="phases", action="store_false", help="phase timing off (the throughput without it)"
    )
    parser.add_argument(
        "--no-http",
        dest="http",
        action="store_false",
        help="the clients are tasks on the server's event loop calling the service directly (no HTTP, JSON or "
        "middleware): what the worker reaches with less Python sharing its GIL",
    )
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--layers", type=int, default=0, help="random weights: override the layer count")
    parser.add_argument(
        "--torch-threads", type=int, default=0, help="torch's intra-op threads for both sides (default: torch's)"
    )
    args = parser.parse_args()
    args.requests = args.requests or 4 * args.clients
    if args.stream and not args.http:
        parser.error("--no-http sends whole answers only")
    if args.role == "server":
        from benchmarks.serving_server import serve

        serve(args)
    else:
        report(args, run(args))


if __name__ == "__main__":
    main()
