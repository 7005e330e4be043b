"""One-off study: `benchmarks.serving --no-http` with the HTTP side's CPU load put back, in a process of its own.

The bound on what running the engine in a process of its own could give on this machine
(docs/experiments/split-process-bound.md): the engine's process keeps its GIL to itself, and still
shares the cores with an HTTP side of the real one's size. A decoy server (uvicorn and FastAPI, the
real request and response models, the prompt encoded, a real answer's latency waited, `--burn-ms` of
Python CPU) answers `--clients` threads of this process during every `--no-http` window.

    TAD_COMPILED_DECODE_LENGTH=288 python -m benchmarks.split_bound --model tiny-llama --device cpu \
        --clients 32 --repeats 4 --no-http --burn-ms 0.5

Every other argument is `benchmarks.serving`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from app.api.native.protocol import GenerateRequest, GenerateResponse  # module level: FastAPI reads the hints
from benchmarks import serving

DECOY_STATS: list[dict[str, float]] = []


def decoy_app(burn_ms: float) -> Any:
    from fastapi import FastAPI

    from benchmarks.random_models import id_tokenizer

    app = FastAPI()
    tokenizer = id_tokenizer(2048)
    # The first window's wait: a real answer's latency at 32 clients in the calibration runs, about 1 s.
    state: dict[str, Any] = {"response": None, "delay": 1.0, "burn": burn_ms / 1000}

    @app.get("/ready")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/decoy/setup")
    async def setup(body: dict[str, Any]) -> dict[str, bool]:
        state.update(body)
        return {"ok": True}

    @app.get("/decoy/cpu")
    async def cpu() -> dict[str, float]:
        return {"cpu": time.process_time()}

    @app.post("/v1/generate", response_model=GenerateResponse)
    async def generate(body: GenerateRequest) -> Any:
        tokenizer.encode(body.prompt)
        await asyncio.sleep(state["delay"])
        end = time.thread_time() + state["burn"]
        while time.thread_time() < end:
            pass
        return state["response"]

    return app


def with_decoy(url: str) -> None:
    """Patch the benchmark's client: the warm-up's first answer becomes the decoy's response, and every
    `--no-http` window runs the decoy's clients alongside."""
    decoy = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=80))
    whole, in_server = serving.Client._whole, serving.Client.in_server
    pending: list[threading.Thread] = []

    def captured(self: serving.Client, body: dict[str, Any]) -> dict[str, Any]:
        result = whole(self, body)
        if not DECOY_STATS and not getattr(captured, "done", False):
            decoy.post(f"{url}/decoy/setup", json={"response": result}).raise_for_status()
            captured.done = True  # type: ignore[attr-defined]
        return result

    def alongside(self: serving.Client, prompts: list[str]) -> list[serving.Answer]:
        for thread in pending:  # the last window's decoy requests still in flight
            thread.join()
        pending.clear()
        stop, sent, failed = threading.Event(), [0], []

        def client(first: int) -> None:
            index = first
            while not stop.is_set():
                response = decoy.post(f"{url}/v1/generate", json=self.body(prompts[index % len(prompts)]))
                if response.status_code != 200:
                    failed.append(f"{response.status_code} {response.text[:200]}")
                    return
                response.json()
                sent[0] += 1
                index += self.args.clients

        cpu_before = decoy.get(f"{url}/decoy/cpu").json()["cpu"]
        pending.extend(threading.Thread(target=client, args=(i,), daemon=True) for i in range(self.args.clients))
        for thread in pending:
            thread.start()
        answers = in_server(self, prompts)
        stop.set()
        if failed:
            raise SystemExit(f"decoy request failed: {failed[0]}")
        cpu_after = decoy.get(f"{url}/decoy/cpu").json()["cpu"]
        delay = statistics.mean(answer.seconds for answer in answers)
        decoy.post(f"{url}/decoy/setup", json={"delay": delay}).raise_for_status()
        DECOY_STATS.append({"requests": sent[0], "cpu": cpu_after - cpu_before, "answers": len(answers)})
        return answers

    serving.Client._whole = captured  # type: ignore[method-assign]
    serving.Client.in_server = alongside  # type: ignore[method-assign]


def report() -> None:
    if not DECOY_STATS:
        return
    requests = sum(s["requests"] for s in DECOY_STATS)
    cpu = sum(s["cpu"] for s in DECOY_STATS)
    print(
        f"decoy: {requests} requests against {sum(s['answers'] for s in DECOY_STATS):.0f} answers, process CPU "
        f"{1000 * cpu / max(requests, 1):.3f} ms a request, {cpu:.2f} s over the windows"
    )


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--decoy-role", choices=["client", "decoy"], default="client")
    parser.add_argument("--burn-ms", type=float, default=0.0)
    parser.add_argument("--decoy-port", type=int, default=8792)
    own, rest = parser.parse_known_args()
    if own.decoy_role == "decoy":
        import uvicorn

        uvicorn.run(decoy_app(own.burn_ms), host="127.0.0.1", port=own.decoy_port, log_level="warning")
        return
    url = f"http://127.0.0.1:{own.decoy_port}"
    command = [sys.executable, "-m", "benchmarks.split_bound", "--decoy-role", "decoy"]
    command += ["--burn-ms", str(own.burn_ms), "--decoy-port", str(own.decoy_port)]
    process = subprocess.Popen(command, cwd=Path(__file__).resolve().parent.parent)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit("decoy not ready") from None
                time.sleep(0.25)
        with_decoy(url)
        sys.argv = [sys.argv[0], *rest]
        serving.main()
        report()
    finally:
        process.terminate()
        process.wait(30)


if __name__ == "__main__":
    main()
