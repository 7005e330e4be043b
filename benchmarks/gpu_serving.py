"""The server's scheduler on a GPU: 32 concurrent HTTP clients against plain `generate` at batch 32.

No weights can reach a GPU machine, so the server runs a randomly initialised model from a real
shape (`benchmarks/gpu_overhead.py`'s configs, bf16) with an artifact whose regressor is random
(same shape, same cost as a trained one): the service does all its work — continuous batching,
attention capture, TAD and the baselines per answer, the policy — whatever the weights say.

One command, two processes: this one starts `--role server` (the model, then `generate` timed at
batch `--clients` in that process, then the app under uvicorn on loopback) and, once `/ready`
answers, sends `--requests` generations from `--clients` threads, each request a fresh random
prompt of `--prompt-tokens` token ids with `max_new_tokens` = `--new-tokens` (greedy; the random
model almost never emits its end token, so answers run to the limit, and usage counts what was
generated either way). Prints both throughputs and the latency percentiles; the last line is
`scheduler_vs_generate=<server tokens/s over generate tokens/s>`.

`--stage2 mlp` or `mlp+ridge` gives the artifact a random MLP stage 2 of the default artifact's size
(alone, or averaged with the ridge); `--stream` makes every client stream, so that each token is
scored the step it is sampled (and checks that every token event carries its confidence).

    python -m benchmarks.gpu_serving --model llama --clients 32 --requests 128
    python -m benchmarks.gpu_serving --model llama --clients 32 --requests 128 --stage2 mlp+ridge --stream
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MANIFEST = REPO / "models" / "smollm2-135m-instruct-tad" / "manifest.json"


def serve(args: argparse.Namespace) -> None:
    """The server side: random model + random artifact wired into the real runtime, then uvicorn."""
    import torch
    import uvicorn

    from app.engine.attention_capture import register_capture_attention
    from app.main import create_app
    from app.serving import runtime as runtime_module
    from app.settings import Settings
    from app.uncertainty.artifact import MANIFEST_NAME, Manifest, TadArtifact
    from app.uncertainty.features import Convention
    from benchmarks.gpu_overhead import CONFIGS, build_model, id_tokenizer, make_engine, random_tad

    config = CONFIGS[args.model]()
    if args.layers:  # a quick trial (e.g. on CPU): fewer layers of the same shape
        config.num_hidden_layers = args.layers
    torch.manual_seed(0)
    model = build_model(config, torch.bfloat16, args.device, register_capture_attention())
    tokenizer = id_tokenizer(config.vocab_size)
    loaded = make_engine(model, tokenizer, args.model, args.n_lags).loaded
    time_generate(model, args)

    tad = random_tad(config.num_hidden_layers, config.num_attention_heads, args.n_lags, args.stage2)
    manifest = Manifest.model_validate(json.loads(DEFAULT_MANIFEST.read_text()))
    features = manifest.features.model_copy(
        update={
            "n_lags": args.n_lags,
            "num_layers": config.num_hidden_layers,
            "num_heads": config.num_attention_heads,
            "convention": Convention.GENERATING,
            "extra_stats": [],
            "stage1_size": tad.spec.stage1_size,
            "stage2_size": tad.spec.stage2_size,
        }
    )
    manifest = manifest.model_copy(
        update={"llm": loaded.identity, "features": features, "created_at": datetime.now(UTC).isoformat()}
    )
    folder = Path(tempfile.mkdtemp()) / f"random-{args.model}-tad"
    folder.mkdir()
    (folder / MANIFEST_NAME).write_text(manifest.model_dump_json(indent=2))  # /info and the metrics hash it
    artifact = TadArtifact(path=folder, manifest=manifest, scorer=tad)
    # The runtime's own loading, with the model and artifact above in place of files on disk.
    runtime_module.load_model = lambda *_, **__: loaded
    runtime_module.Runtime._load_artifact = lambda self: artifact  # type: ignore[method-assign]
    settings = Settings(
        device=args.device,
        max_batch_size=args.clients,
        max_queue=4 * args.requests,
        max_prompt_tokens=args.prompt_tokens + 16,
        max_new_tokens_limit=args.new_tokens,
        reject_target=None,
        reject_threshold=0.5,
    )

    def fatal(reason: str) -> None:
        print(f"server failed: {reason}", file=sys.stderr, flush=True)
        os._exit(1)

    app = create_app(settings, on_fatal=fatal)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


def time_generate(model: object, args: argparse.Namespace) -> None:
    """Plain transformers `generate` at batch `--clients` (same prompt and answer lengths), printed."""
    import torch

    from benchmarks.gpu_overhead import synchronize

    vocab = model.config.vocab_size  # type: ignore[attr-defined]
    ids = torch.randint(2, vocab, (args.clients, args.prompt_tokens), device=args.device)
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=1)  # type: ignore[attr-defined]
        times = []
        for _ in range(args.generate_repeats):
            synchronize()
            started = time.perf_counter()
            model.generate(  # type: ignore[attr-defined]
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.new_tokens,
                do_sample=False,
                pad_token_id=1,
            )
            synchronize()
            times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    Path(args.result_file).write_text(json.dumps({"tokens_per_s": args.clients * args.new_tokens / seconds}))
    print(
        f"generate_tokens_per_s={args.clients * args.new_tokens / seconds:.1f} "
        f"(batch {args.clients}, median of {len(times)} runs of {seconds:.2f} s)",
        flush=True,
    )


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("server not ready in time")


def clients(args: argparse.Namespace) -> None:
    """The client side: start the server, wait, load it from `--clients` threads, print the numbers."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "benchmarks.gpu_serving", "--role", "server", *sys.argv[1:]]
    process = subprocess.Popen(command, cwd=REPO, env=env)
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_ready(url, process, args.ready_timeout)
        rng = random.Random(0)
        vocab = httpx.get(f"{url}/info").json()["model"]["vocab_size"]

        def payload() -> dict:
            # Ids 2000..9999: the id tokenizer's special tokens "t0"/"t1" would split words that start like them.
            prompt = " ".join(f"t{rng.randrange(2000, min(vocab, 10_000))}" for _ in range(args.prompt_tokens))
            return {"prompt": prompt, "max_new_tokens": args.new_tokens, "return_tokens": False, "stream": args.stream}

        def one(body: dict) -> tuple[float, int, bool]:
            started = time.perf_counter()
            if args.stream:
                result = streamed(body)
            else:
                response = httpx.post(f"{url}/v1/generate", json=body, timeout=600)
                if response.status_code != 200:
                    raise SystemExit(f"request failed: {response.status_code} {response.text[:300]}")
                result = response.json()
            scored = result["decision"]["method"] == "tad" and result["decision"]["score"] is not None
            if result["usage"]["prompt_tokens"] != args.prompt_tokens:
                raise SystemExit(f"prompt of {result['usage']['prompt_tokens']} tokens, not {args.prompt_tokens}")
            return time.perf_counter() - started, int(result["usage"]["completion_tokens"]), scored

        def streamed(body: dict) -> dict:
            """The `final` event's response after every `token` event (each carrying its confidence)."""
            tokens, event = 0, ""
            with httpx.stream("POST", f"{url}/v1/generate", json=body, timeout=600) as response:
                if response.status_code != 200:
                    raise SystemExit(f"request failed: {response.status_code} {response.read()[:300]!r}")
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        event = line.removeprefix("event: ")
                    elif line.startswith("data: ") and event == "token":
                        tokens += 1
                        if json.loads(line.removeprefix("data: "))["confidence"] is None:
                            raise SystemExit("a streamed token came without its TAD confidence")
                    elif line.startswith("data: ") and event == "final":
                        final = json.loads(line.removeprefix("data: "))
                        if tokens != final["usage"]["completion_tokens"]:
                            raise SystemExit(f"{tokens} token events for {final['usage']['completion_tokens']} tokens")
                        return final
            raise SystemExit("the stream ended without its final event")

        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(one, [payload() for _ in range(args.clients)]))  # warm-up
            bodies = [payload() for _ in range(args.requests)]
            started = time.perf_counter()
            results = list(pool.map(one, bodies))
            seconds = time.perf_counter() - started
        metrics = httpx.get(f"{url}/metrics").text
    finally:
        process.terminate()
        process.wait(60)
    generate_tokens_per_s = json.loads(Path(args.result_file).read_text())["tokens_per_s"]
    latencies = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    batch_lines = [line for line in metrics.splitlines() if line.startswith("tad_batch_size_sum")]
    print(
        f"server_tokens_per_s={tokens / seconds:.1f} ({args.requests} requests from {args.clients} clients, "
        f"{tokens} tokens in {seconds:.1f} s; p50 latency {latencies[len(latencies) // 2]:.2f} s, "
        f"p99 {latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]:.2f} s; "
        f"every answer decided on its TAD score: {all(r[2] for r in results)}); {' '.join(batch_lines)}"
    )
    print(f"generate_tokens_per_s={generate_tokens_per_s:.1f} (batch {args.clients})")
    print(f"scheduler_vs_generate={tokens / seconds / generate_tokens_per_s:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", choices=["client", "server"], default="client")
    parser.add_argument("--model", default="llama", help="a config name of benchmarks/gpu_overhead.py")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--n-lags", type=int, default=10)
    parser.add_argument(
        "--stage2", choices=("ridge", "mlp", "mlp+ridge"), default="ridge", help="the random artifact's stage 2"
    )
    parser.add_argument("--stream", action="store_true", help="clients stream (each token scored as it is sampled)")
    parser.add_argument("--generate-repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--device", default="cuda", help="cpu only for trying the script out (with --layers)")
    parser.add_argument("--layers", type=int, default=0, help="override the layer count (quick trials)")
    parser.add_argument(
        "--result-file",
        default=str(Path(tempfile.gettempdir()) / "gpu_serving_generate.json"),
        help="where the server process leaves generate's throughput for this one",
    )
    args = parser.parse_args()
    if args.role == "server":
        serve(args)
    else:
        clients(args)


if __name__ == "__main__":
    main()
