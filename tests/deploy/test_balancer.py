"""Three replicas behind HAProxy (deploy/haproxy.cfg) under load and faults.

200 requests from 16 clients; mid-run one replica is SIGKILLed and another SIGTERMed. Every
request must end with 200 or a declared error (429/503, retried by the client per
Retry-After): none lost, none hanging. Counts and latency percentiles are printed.

A SIGKILL that lands after a replica has written a response's headers and before its body cuts
a response the balancer has already begun to forward: no balancer can retry that, so the client
retries it, as the OpenAI client does on a connection error (generation has no side effects).
Only requests in flight on the killed replica can be cut.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from benchmarks.server_process import free_port, wait_until_ready

REPO = Path(__file__).resolve().parents[2]
REQUESTS, CLIENTS = 200, 16
DECLARED = {200, 429, 503}


def _haproxy() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("haproxy is not installed (`make test` installs it: scripts/install_test_packages.sh)")
        pytest.skip("haproxy is not installed")
    return found


def _replica(model: Path, artifact: Path, port: int, cache: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TAD_MODEL": str(model),
        "TAD_ARTIFACT_DIR": str(artifact),
        "TAD_HOST": "127.0.0.1",
        "TAD_PORT": str(port),
        "TAD_CACHE_DIR": str(cache),
        "TAD_GRACEFUL_SHUTDOWN_S": "20",
        "TAD_LOG_LEVEL": "warning",
    }
    return subprocess.Popen([sys.executable, "-m", "app"], cwd=REPO, env=env, stdout=subprocess.DEVNULL)


def _send(client: httpx.Client, url: str, index: int, cuts: list[str]) -> tuple[int, float, int]:
    """One request, retried on 429/503 per Retry-After and on a cut response (at most 5 tries):
    (final status, seconds, tries). A hang (timeout) raises."""
    started = time.monotonic()
    payload = {"prompt": f"what is the capital of france ? {index}", "max_new_tokens": 12}
    for attempt in range(1, 6):
        try:
            response = client.post(f"{url}/v1/generate", json=payload)
        except httpx.RemoteProtocolError as error:  # the connection closed mid-response
            if attempt == 5:
                raise
            cuts.append(str(error))
            continue
        if response.status_code not in (429, 503) or attempt == 5:
            return response.status_code, time.monotonic() - started, attempt
        time.sleep(min(float(response.headers.get("Retry-After", "1")), 2.0))
    raise AssertionError("unreachable")


def test_replicas_behind_haproxy_lose_no_request_when_one_is_killed_and_one_drains(
    tiny_model_dir: Path, tiny_artifact: Path, tmp_path: Path
) -> None:
    haproxy = _haproxy()
    ports = [free_port() for _ in range(3)]
    replicas = [_replica(tiny_model_dir, tiny_artifact, port, tmp_path / f"cache{i}") for i, port in enumerate(ports)]
    balancer_port = free_port()
    env = {
        **os.environ,
        "TAD_BALANCER_BIND": f"127.0.0.1:{balancer_port}",
        **{f"TAD_REPLICA_{i + 1}": f"127.0.0.1:{port}" for i, port in enumerate(ports)},
    }
    balancer = subprocess.Popen([haproxy, "-db", "-f", str(REPO / "deploy" / "haproxy.cfg")], env=env)
    url = f"http://127.0.0.1:{balancer_port}"
    try:
        for port, process in zip(ports, replicas, strict=True):
            wait_until_ready(f"http://127.0.0.1:{port}", 120, alive=lambda p=process: p.poll() is None)
        time.sleep(2.5)  # two health checks: every replica is in the pool
        results: list[tuple[int, float, int]] = []
        failures: list[str] = []
        cuts: list[str] = []  # responses cut by the SIGKILL, retried by the client
        lock = threading.Lock()
        counter = iter(range(REQUESTS))

        def client_loop() -> None:
            with httpx.Client(timeout=60) as client:
                while True:
                    with lock:
                        index = next(counter, None)
                    if index is None:
                        return
                    try:
                        outcome = _send(client, url, index, cuts)
                    except httpx.HTTPError as error:  # a hang (timeout) or a dropped connection: lost
                        with lock:
                            failures.append(f"{type(error).__name__}: {error}")
                        continue
                    with lock:
                        results.append(outcome)

        threads = [threading.Thread(target=client_loop) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()

        def wait_for_answers(count: int) -> None:
            """Lost requests count too: were every one lost, waiting for answers alone would never end."""
            deadline = time.monotonic() + 120
            while len(results) + len(failures) < count:
                assert time.monotonic() < deadline, f"{len(results)} answered, {failures[:3]}"
                time.sleep(0.01)

        wait_for_answers(REQUESTS // 3)
        replicas[0].send_signal(signal.SIGKILL)
        wait_for_answers(2 * REQUESTS // 3)
        replicas[1].send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "a client hung"
        statuses = Counter(status for status, _, _ in results)
        latencies = sorted(seconds for _, seconds, _ in results)
        retried = sum(1 for _, _, tries in results if tries > 1)
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        print(
            f"\nbalancer: {len(results)} answered, {len(failures)} lost, statuses {dict(statuses)}, "
            f"{retried} retried by the client ({len(cuts)} cut by the SIGKILL), "
            f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms"
        )
        assert not failures, failures[:3]
        assert len(cuts) <= 2, cuts  # only a response caught by the SIGKILL between headers and body
        assert len(results) == REQUESTS
        assert set(statuses) <= DECLARED, statuses
        assert statuses[200] >= REQUESTS - 5  # the balancer retries; the client retries what is left
        assert replicas[1].wait(30) == 0  # the drained replica exits cleanly
    finally:
        for process in [*replicas, balancer]:
            if process.poll() is None:
                process.kill()
                process.wait(10)


def test_the_balancers_own_503_says_when_to_retry(tmp_path: Path) -> None:
    """With no replica up (all loading, or all draining) HAProxy answers for them: with Retry-After too."""
    haproxy = _haproxy()
    balancer_port = free_port()
    env = {
        **os.environ,
        "TAD_BALANCER_BIND": f"127.0.0.1:{balancer_port}",
        **{f"TAD_REPLICA_{i}": f"127.0.0.1:{free_port()}" for i in (1, 2, 3)},  # nothing listens there
    }
    balancer = subprocess.Popen(
        [haproxy, "-db", "-f", str(REPO / "deploy" / "haproxy.cfg")], env=env, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                response = httpx.post(f"http://127.0.0.1:{balancer_port}/v1/generate", json={"prompt": "x"})
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline and balancer.poll() is None, "the balancer did not start"
                time.sleep(0.1)
        assert response.status_code == 503 and int(response.headers["Retry-After"]) > 0
    finally:
        balancer.terminate()
        balancer.wait(10)


def test_compose_runs_the_same_balancer_layout() -> None:
    import yaml

    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    balancer = compose["services"]["balancer"]
    replicas = {name for name in compose["services"] if name.startswith("tad")}
    addresses = {
        value.split(":")[0] for key, value in balancer["environment"].items() if key.startswith("TAD_REPLICA_")
    }
    assert addresses == replicas and len(replicas) == 3
    assert "./deploy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in balancer["volumes"]
    check = subprocess.run(
        [_haproxy(), "-c", "-f", str(REPO / "deploy" / "haproxy.cfg")],
        env={**os.environ, **{k: str(v) for k, v in balancer["environment"].items()}},
        capture_output=True,
        text=True,
    )
    # Compose's service names resolve only inside its network: init-addr lets the check (and a start
    # before the replicas exist) pass without them.
    assert check.returncode == 0, check.stderr
