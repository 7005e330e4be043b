"""Start `python -m app` as a subprocess on a free loopback port and wait until it is ready."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_ready(url: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Poll `/ready` until it answers 200; fail if `alive()` turns false or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if not alive():
            raise SystemExit("server exited before it was ready")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("server did not become ready")
        time.sleep(0.1)


@contextmanager
def running_server(env: dict[str, str], ready_timeout: float = 300.0) -> Iterator[str]:
    port = free_port()
    full_env = {**os.environ, "TAD_HOST": "127.0.0.1", "TAD_PORT": str(port), "TAD_LOG_LEVEL": "warning", **env}
    process = subprocess.Popen([sys.executable, "-m", "app"], cwd=REPO, env=full_env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, ready_timeout, alive=lambda: process.poll() is None)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
