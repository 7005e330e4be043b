"""Aggregate throughput of the server, sequential clients vs 8 concurrent clients, on the default model.

Starts `python -m app` on loopback (default model and artifact), sends the same workload
(greedy, so the same answers both times) once request by request and once from 8
concurrent clients, and prints tokens/s for both. Last line: `concurrency_speedup=<ratio>`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from benchmarks.server_process import running_server

QUESTIONS = [
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Name three planets of the solar system.",
    "Who wrote the play Romeo and Juliet?",
    "What is photosynthesis? Answer briefly.",
    "Give a short definition of a prime number.",
    "What is the boiling point of water at sea level?",
    "Describe a cat in one sentence.",
    "What does a lighthouse keeper do?",
    "List two uses of copper.",
    "Why do leaves change colour in autumn?",
    "What is the largest ocean on Earth?",
    "Translate 'good morning' into French.",
    "What is the square root of 81?",
    "Name a famous painting by Leonardo da Vinci.",
    "What causes tides on Earth?",
]


def run(url: str, requests: list[dict], clients: int) -> tuple[float, int, list[float]]:
    latencies: list[float] = []

    def one(payload: dict) -> int:
        started = time.perf_counter()
        response = httpx.post(f"{url}/v1/generate", json=payload, timeout=600)
        response.raise_for_status()
        latencies.append(time.perf_counter() - started)
        return int(response.json()["usage"]["completion_tokens"])

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(one, requests))
    return time.perf_counter() - started, tokens, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="passes over the 16 questions")
    args = parser.parse_args()
    requests = [
        {"messages": [{"role": "user", "content": q}], "max_new_tokens": args.max_new_tokens, "return_tokens": False}
        for q in QUESTIONS * args.rounds
    ]
    env = {"TAD_MAX_BATCH_SIZE": str(args.clients), "TAD_MAX_QUEUE": str(4 * len(requests))}
    with running_server(env) as url:
        run(url, requests[:2], 2)  # warm-up
        sequential = run(url, requests, 1)
        concurrent = run(url, requests, args.clients)
        info = httpx.get(f"{url}/info").json()
    print(
        f"model {info['model']['name']}, artifact {info['artifact']['name'] if info['artifact'] else None}, "
        f"{len(requests)} requests, max_new_tokens {args.max_new_tokens}"
    )
    print(f"{'clients':<12} {'seconds':>8} {'tokens':>7} {'tokens/s':>9} {'p50 latency s':>14}")
    for label, (seconds, tokens, latencies) in (("1 (sequential)", sequential), (str(args.clients), concurrent)):
        print(f"{label:<12} {seconds:>8.1f} {tokens:>7} {tokens / seconds:>9.1f} {statistics.median(latencies):>14.2f}")
    if sequential[1] != concurrent[1]:
        print(f"note: token counts differ ({sequential[1]} vs {concurrent[1]})")
    speedup = (concurrent[1] / concurrent[0]) / (sequential[1] / sequential[0])
    print(f"concurrency_speedup={speedup:.2f}")


if __name__ == "__main__":
    main()
