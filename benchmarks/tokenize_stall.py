"""How long a request with a very long text stops the server answering anything else.

A server on a tiny random model (`tests/fixtures`, built in a second), its body limit at the default
1 MB. One client sends `--requests` generations whose prompt is `--chars` characters (refused with a
422 once counted: far over the prompt limit, as a careless or hostile client's would be), one at a
time; another polls `/health` every `--poll-ms` meanwhile. Printed: the `/health` latencies while the
long requests run against those of a quiet server, in the same run. While a text is tokenized on the
event loop, nothing else is answered: not a health probe, not a stream's next token, not a
disconnect check.

    python -m benchmarks.tokenize_stall
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks.server_process import running_server
from tests.fixtures.tiny_model import write_tiny_model

MIN_PROBES = 3  # per window: a window shorter than the poller's start (short prompts, a loaded machine) had none


def health_latencies(url: str, stop: threading.Event, poll_s: float) -> list[float]:
    latencies: list[float] = []
    with httpx.Client(timeout=30) as http:
        while not stop.is_set() or len(latencies) < MIN_PROBES:
            started = time.perf_counter()
            http.get(f"{url}/health").raise_for_status()
            latencies.append(time.perf_counter() - started)
            time.sleep(poll_s)
    return latencies


def polled_while(url: str, poll_s: float, work: threading.Thread | None, quiet_s: float) -> list[float]:
    """/health latencies while `work` runs (or for `quiet_s` when there is none)."""
    stop, result = threading.Event(), []
    poller = threading.Thread(target=lambda: result.extend(health_latencies(url, stop, poll_s)))
    poller.start()
    if work is None:
        time.sleep(quiet_s)
    else:
        work.start()
        work.join()
    stop.set()
    poller.join()
    return result


def summary(latencies: list[float]) -> str:
    ms = sorted(1000 * value for value in latencies)
    return f"{len(ms)} probes, median {statistics.median(ms):.1f} ms, max {ms[-1]:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--chars", type=int, default=199_000, help="the long prompt's length (a text field holds at most 200,000)"
    )
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--poll-ms", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model = write_tiny_model(Path(folder) / "model")
        env = {"TAD_MODEL": str(model), "TAD_ARTIFACT_DIR": "", "TAD_DECISION_LOG": "false"}
        with running_server(env) as url:
            body = {"prompt": "word " * (args.chars // 5), "max_new_tokens": 4}
            seconds: list[float] = []

            def send_long() -> None:
                with httpx.Client(timeout=120) as http:
                    for _ in range(args.requests):
                        started = time.perf_counter()
                        status = http.post(f"{url}/v1/generate", json=body).status_code
                        seconds.append(time.perf_counter() - started)
                        if status != 422:
                            raise SystemExit(f"the long prompt got {status}, not the 422 of a prompt over the limit")

            busy = polled_while(url, args.poll_ms / 1000, threading.Thread(target=send_long), 0)
            quiet = polled_while(url, args.poll_ms / 1000, None, sum(seconds))
    print(f"long prompts: {args.requests} of {args.chars:,} characters, {statistics.median(seconds):.2f} s each")
    print(f"/health, server quiet:           {summary(quiet)}")
    print(f"/health, during the long prompts: {summary(busy)}")
    print(f"stall_ratio={max(busy) / max(quiet):.1f}  (worst /health latency, busy over quiet)")


if __name__ == "__main__":
    main()
