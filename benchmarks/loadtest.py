"""Overload the server on loopback and check that every request gets a final answer.

Fires --requests requests from --concurrency asyncio clients at a server whose queue is
small, so many are refused. Passes when every request ends with a declared status (200,
429, 503 or 504) — none lost, none hanging past its client timeout — and the server is
still ready afterwards. Prints the counts and p50/p99 latency per status.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from benchmarks.server_process import running_server

DECLARED = {200, 429, 503, 504}


@dataclass
class LoadResult:
    statuses: Counter[str] = field(default_factory=Counter)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    ready_after: bool = False

    @property
    def ok(self) -> bool:
        """Every request ended with a declared status (a 200 stream with its final event)."""
        return self.ready_after and all(key.isdigit() and int(key) in DECLARED for key in self.statuses)

    def report(self) -> str:
        lines = [f"{'outcome':<22} {'count':>6} {'p50 s':>8} {'p99 s':>8}"]
        for key, count in sorted(self.statuses.items()):
            values = sorted(self.latencies[key])
            p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
            lines.append(f"{key:<22} {count:>6} {statistics.median(values):>8.3f} {p99:>8.3f}")
        lines.append(f"ready afterwards: {self.ready_after}; every request answered with a declared status: {self.ok}")
        return "\n".join(lines)


async def run_load(url: str, requests: int, concurrency: int, max_new_tokens: int, timeout: float) -> LoadResult:
    result = LoadResult()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(requests):
        queue.put_nowait(index)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            index = queue.get_nowait()
            payload = {
                "messages": [{"role": "user", "content": f"Tell me fact number {index} about the sea."}],
                "max_new_tokens": max_new_tokens,
                "stream": index % 5 == 0,
                "return_tokens": False,
            }
            started = time.perf_counter()
            try:
                response = await http.post(f"{url}/v1/generate", json=payload, timeout=timeout)
                body = await response.aread()
                key = str(response.status_code)
                if payload["stream"] and response.status_code == 200 and b"event: final" not in body:
                    key = "stream without final event"
            except httpx.TimeoutException:
                key = "timeout (hung)"
            except httpx.TransportError as error:
                key = f"lost ({type(error).__name__})"
            result.statuses[key] += 1
            result.latencies.setdefault(key, []).append(time.perf_counter() - started)

    async with httpx.AsyncClient(limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        result.ready_after = (await http.get(f"{url}/ready", timeout=30)).status_code == 200
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="an already running server (default: start one)")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()

    def go(url: str) -> LoadResult:
        return asyncio.run(run_load(url, args.requests, args.concurrency, args.max_new_tokens, args.timeout))

    if args.url:
        result = go(args.url)
    else:
        with running_server({"TAD_MAX_BATCH_SIZE": "8", "TAD_MAX_QUEUE": "8"}) as url:
            result = go(url)
    print(f"{args.requests} requests from {args.concurrency} concurrent clients")
    print(result.report())
    raise SystemExit(0 if result.ok else 1)


if __name__ == "__main__":
    main()
