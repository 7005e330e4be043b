"""`python -m app`: serve with uvicorn on TAD_HOST:TAD_PORT, draining gracefully on SIGTERM.

On SIGTERM (or Ctrl-C) the service stops taking work: `/ready` and new `/v1` requests
answer 503, requests in flight get up to TAD_GRACEFUL_SHUTDOWN_S to finish, then the
server exits; requests still running then are answered with a 503 (streams: an error event). A
second signal does that at once and exits (the app's shutdown still runs; a third stops uvicorn
waiting for connections). If the model or artifact fails to load,
the process exits with status 1 and says why. SIGHUP reloads the artifact at
TAD_ARTIFACT_DIR without a restart (as `POST /admin/reload-artifact` does); a refused
one is logged and the previous one keeps serving.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn
from pydantic import ValidationError
from pydantic_settings import SettingsError

from app.errors import NotReady
from app.main import create_app
from app.serving.runtime import ArtifactReloadError, Runtime
from app.serving.scheduler import STOP_TIMEOUT_S
from app.settings import Settings, unknown_variables

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

logger = logging.getLogger("app")

# After in-flight requests are answered with a 503 at shutdown, how long their handlers get to send it.
ANSWER_SETTLE_S = 2.0
# Then how long uvicorn waits for open connections, and the scheduler's worker for its last forward.
UVICORN_SHUTDOWN_S = 5
# The longest a shutdown takes after the drain: a deployment's grace period before SIGKILL covers the
# drain (TAD_GRACEFUL_SHUTDOWN_S) plus this.
AFTER_DRAIN_S = ANSWER_SETTLE_S + UVICORN_SHUTDOWN_S + STOP_TIMEOUT_S


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, runtime: Runtime, grace_s: float) -> None:
        super().__init__(config)
        self.runtime = runtime
        self.grace_s = grace_s
        self._draining = False
        self._stopping = False
        self.exit_code = 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal handler runs on the event loop's thread between two bytecodes, possibly while that thread
        # holds a plain lock (the runtime's, a metric's) that draining takes too: taken here, it would never
        # be released. So the handler only flags and starts a thread, which can wait for such a lock.
        if self._stopping:
            self.force_exit = True  # a third: uvicorn waits for nothing, the app's shutdown is skipped
            return
        if self._draining:
            # A second signal: stop now, but answer what is in flight first (a 503 each, see _abandon_in_flight).
            self._stopping = True
            threading.Thread(target=self._stop_now, args=(sig,), daemon=True).start()
            return
        self._draining = True
        threading.Thread(target=self._drain_and_exit, args=(sig,), daemon=True).start()

    def _drain_and_exit(self, sig: int) -> None:
        logger.info(
            "signal %d: draining (up to %.0f s for %d requests)", sig, self.grace_s, self.runtime.http_in_flight
        )
        self.runtime.begin_draining()
        deadline = time.monotonic() + self.grace_s
        while self.runtime.http_in_flight > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.runtime.http_in_flight > 0:
            logger.warning("grace period over with %d requests in flight", self.runtime.http_in_flight)
            self._abandon_in_flight()
        self.should_exit = True

    def _stop_now(self, sig: int) -> None:
        logger.warning("signal %d again: stopping now", sig)
        self._abandon_in_flight()
        # Not force_exit: that skips the app's shutdown (the scheduler's worker is not stopped) and uvicorn logs
        # the lifespan's cancellation as an error. Answered connections close at once; uvicorn waits at most
        # UVICORN_SHUTDOWN_S for any other.
        self.should_exit = True

    def _abandon_in_flight(self) -> None:
        """Answer every request still running or queued with a 503 (a stream: its error event) and give the
        handlers a moment to send it: cut by the exit instead, clients would get a bare 500 or a broken
        stream."""
        scheduler = self.runtime.scheduler
        if scheduler is None:
            return
        scheduler.abandon_everything(NotReady("the service shut down before this answer was finished", 10))
        settle = time.monotonic() + ANSWER_SETTLE_S
        while self.runtime.http_in_flight > 0 and time.monotonic() < settle:
            time.sleep(0.05)

    def fail(self) -> None:
        self.exit_code = 1
        self.should_exit = True


def reload_on_sighup(runtime: Runtime) -> None:
    """SIGHUP: reload the artifact in a thread (hashing and unpickling must not block the signal handler)."""

    def reload() -> None:
        # A refusal is already logged with its reason; the previous artifact keeps serving.
        with contextlib.suppress(ArtifactReloadError):
            runtime.reload_artifact()

    def handler(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=reload, name="tad-artifact-reload", daemon=True).start()

    signal.signal(signal.SIGHUP, handler)


def _problem(prefix: str, item: ErrorDetails) -> str:
    """One line of a settings error: the variable it is about, and why (a contradiction between settings has
    no location: its message names them)."""
    message = str(item["msg"]).removeprefix("Value error, ")
    return f"{prefix}{str(item['loc'][0]).upper()}: {message}" if item["loc"] else message


def load_settings() -> Settings:
    """The settings, or exit 1 with one line naming each bad variable (a traceback says less); a `TAD_*`
    variable that sets nothing is one of them."""
    prefix = Settings.model_config.get("env_prefix", "")
    unknown = unknown_variables(os.environ)
    if unknown:
        print(f"tad-serve: cannot start: {'; '.join(unknown)}", file=sys.stderr, flush=True)
        sys.exit(1)
    try:
        return Settings()
    except ValidationError as error:
        # Never the value itself: it may be the API key.
        problems = "; ".join(_problem(prefix, item) for item in error.errors())
        print(f"tad-serve: cannot start: {problems}", file=sys.stderr, flush=True)
        sys.exit(1)
    except SettingsError as error:  # a value the source cannot parse at all (a list setting not in JSON)
        # pydantic-settings names the field; the user set the variable.
        named = re.sub(r'field "(\w+)"', lambda match: prefix + match.group(1).upper(), str(error))
        print(f'tad-serve: cannot start: {named} (list settings are JSON, e.g. ["a", "b"])', file=sys.stderr)
        sys.exit(1)


def check_port_free(host: str, port: int) -> None:
    """Exit 1 at once when the address is taken: uvicorn would find out only after the model has loaded
    (a minute for the default model), and exit with its own status 3."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET  # "::" listens on IPv6
        with socket.create_server((host, port), family=family):
            pass
    except OSError as error:
        reason = (
            "it is in use" if error.errno == errno.EADDRINUSE else "not an address of this machine, or no permission"
        )
        print(f"tad-serve: cannot start: cannot listen on {host}:{port}: {reason}", file=sys.stderr)
        sys.exit(1)


def parse_arguments(argv: list[str] | None = None) -> None:
    """`--help` lists the settings; the service takes no arguments (a mistyped one is refused, not ignored)."""
    prefix = Settings.model_config.get("env_prefix", "")
    lines = []
    for name, field in Settings.model_fields.items():
        value = field.get_default(call_default_factory=True)
        default = "unset" if value is None else json.dumps(value) if isinstance(value, list) else str(value)
        described = f": {field.description}" if field.description else ""
        lines.append(f"  {prefix}{name.upper()} (default: {default}){described}")
    parser = argparse.ArgumentParser(
        prog="python -m app",
        description="Serve the model and its TAD artifact (uncertainty-gated generation) on TAD_HOST:TAD_PORT. "
        "Configured by environment variables, not arguments: docs/configuration.md.",
        epilog="settings:\n" + "\n".join(lines),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.parse_args(argv)


def main() -> None:
    parse_arguments()
    settings = load_settings()
    check_port_free(settings.host, settings.port)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    holder: dict[str, DrainingServer] = {}

    def on_fatal(reason: str) -> None:
        print(f"tad-serve: cannot start: {reason}", file=sys.stderr, flush=True)
        holder["server"].fail()

    app = create_app(settings, on_fatal=on_fatal)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=UVICORN_SHUTDOWN_S,
        access_log=False,
    )
    server = DrainingServer(config, app.state.runtime, settings.graceful_shutdown_s)
    holder["server"] = server
    reload_on_sighup(app.state.runtime)
    server.run()
    sys.exit(server.exit_code)


if __name__ == "__main__":
    main()
