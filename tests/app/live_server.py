"""The service on a real loopback socket (uvicorn in a thread), for clients that need a URL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from app.main import create_app
from app.settings import Settings
from benchmarks.server_process import free_port, wait_until_ready


@contextmanager
def live_server(settings: Settings) -> Iterator[str]:
    port = free_port()
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, 60, alive=thread.is_alive)
        yield url
    finally:
        server.should_exit = True
        thread.join(30)
