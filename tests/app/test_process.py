"""The server as a real process: graceful drain on SIGTERM, and a clear non-zero exit when loading fails."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from app.__main__ import DrainingServer, parse_arguments
from app.hashing import file_sha256
from app.serving.metrics import ServiceMetrics
from app.serving.runtime import Runtime, State
from app.settings import Settings
from benchmarks.server_process import free_port, wait_until_ready

REPO = Path(__file__).resolve().parents[2]


def start_server(env: dict[str, str]) -> subprocess.Popen[str]:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TAD_LOG_LEVEL": "info", **env}
    return subprocess.Popen(
        [sys.executable, "-m", "app"],
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def start_slow_server(slow_model: Path, tmp_path: Path, grace_s: int) -> tuple[subprocess.Popen[str], str]:
    """The slow model (1,500 tokens take seconds), no artifact, `grace_s` of drain: the process and its URL."""
    port = free_port()
    env = {
        "TAD_MODEL": str(slow_model),
        "TAD_ARTIFACT_DIR": str(tmp_path / "none"),
        "TAD_PORT": str(port),
        "TAD_MAX_NEW_TOKENS_LIMIT": "1500",
        "TAD_GRACEFUL_SHUTDOWN_S": str(grace_s),
        "TAD_CACHE_DIR": str(tmp_path / "cache"),
    }
    return start_server(env), f"http://127.0.0.1:{port}"


def test_sigterm_drains_in_flight_requests_and_refuses_new_ones(slow_model: Path, tmp_path: Path) -> None:
    process, url = start_slow_server(slow_model, tmp_path, grace_s=60)
    try:
        wait_until_ready(url, 90, alive=lambda: process.poll() is None)
        events: list[str] = []
        first_token = threading.Event()

        def in_flight() -> None:
            payload = {"prompt": "the capital of", "max_new_tokens": 1500, "stream": True}
            with httpx.stream("POST", f"{url}/v1/generate", json=payload, timeout=120) as response:
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        events.append(line.removeprefix("event: "))
                        first_token.set()
                    elif line.startswith("data: ") and events and events[-1] == "final":
                        events.append(json.loads(line.removeprefix("data: "))["finish_reason"])

        client = threading.Thread(target=in_flight)
        client.start()
        assert first_token.wait(60)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert "final" not in events  # still generating when the signal came
        refused = httpx.post(f"{url}/v1/generate", json={"prompt": "a", "max_new_tokens": 2}, timeout=10)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "not_ready"
        assert httpx.get(f"{url}/ready", timeout=10).status_code == 503
        client.join(120)
        assert events[-2:] == ["final", "length"] and events.count("token") == 1500
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_requests_still_running_when_the_grace_period_ends_get_a_503_not_a_cut(
    slow_model: Path, tmp_path: Path
) -> None:
    process, url = start_slow_server(slow_model, tmp_path, grace_s=1)
    try:
        wait_until_ready(url, 90, alive=lambda: process.poll() is None)
        answers: dict[str, object] = {}
        streaming = threading.Event()

        def plain() -> None:
            response = httpx.post(f"{url}/v1/generate", json={"prompt": "the", "max_new_tokens": 1500}, timeout=60)
            answers["plain"] = (response.status_code, response.headers.get("content-type"), response.json())

        def streamed() -> None:
            events: list[str] = []
            payload = {"prompt": "the", "max_new_tokens": 1500, "stream": True}
            with httpx.stream("POST", f"{url}/v1/generate", json=payload, timeout=60) as response:
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        events.append(line.removeprefix("event: "))
                        streaming.set()
            answers["stream"] = events

        clients = [threading.Thread(target=plain), threading.Thread(target=streamed)]
        for client in clients:
            client.start()
        assert streaming.wait(30)  # the stream is generating
        wait_for_requests_in_flight(url, 2, timeout=30)  # and the plain request has reached the server
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        for client in clients:
            client.join(60)
        status, content_type, body = answers["plain"]  # type: ignore[misc]
        assert status == 503 and content_type == "application/json" and body["error"]["type"] == "not_ready"
        assert answers["stream"][-1] == "error" and "final" not in answers["stream"]  # type: ignore[index]
        assert process.wait(30) == 0
        assert time.monotonic() - signalled < 15  # 1 s of grace, the answers, the exit: not the 1,500 tokens
    finally:
        if process.poll() is None:
            process.kill()


def test_a_second_signal_answers_what_is_in_flight_and_still_shuts_the_app_down_cleanly(
    slow_model: Path, tmp_path: Path
) -> None:
    """The impatient operator's Ctrl-C twice: a 503 at once rather than the drain, and the app's own shutdown
    still runs (uvicorn's forced exit skipped it, and logged the lifespan's cancellation as an error)."""
    process, url = start_slow_server(slow_model, tmp_path, grace_s=60)
    try:
        wait_until_ready(url, 90, alive=lambda: process.poll() is None)
        answers: dict[str, object] = {}

        def plain() -> None:
            response = httpx.post(f"{url}/v1/generate", json={"prompt": "the", "max_new_tokens": 1500}, timeout=60)
            answers["plain"] = (response.status_code, response.json()["error"]["type"])

        client = threading.Thread(target=plain)
        client.start()
        wait_for_requests_in_flight(url, 1, timeout=30)
        process.send_signal(signal.SIGINT)
        wait_until_draining(url, timeout=10)
        process.send_signal(signal.SIGINT)
        client.join(60)
        assert answers["plain"] == (503, "not_ready")
        assert process.wait(30) == 0
        log = process.stdout.read() if process.stdout else ""
        assert "again: stopping now" in log and "Application shutdown complete" in log
        assert "Traceback" not in log and "ERROR" not in log
    finally:
        if process.poll() is None:
            process.kill()


def wait_until_draining(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while httpx.get(f"{url}/ready", timeout=10).status_code == 200:
        assert time.monotonic() < deadline, "the first signal did not start the drain"
        time.sleep(0.05)


def test_a_model_that_fails_to_load_exits_non_zero(tmp_path: Path) -> None:
    process = start_server({"TAD_MODEL": str(tmp_path / "missing-model"), "TAD_PORT": str(free_port())})
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1
    assert "cannot start: model path not found" in output


def test_a_bad_setting_exits_non_zero_naming_the_variable() -> None:
    process = start_server({"TAD_PORT": "eighty", "TAD_REJECT_THRESHOLD": "nan", "TAD_COMPILED_DECODE_LENGTH": "x"})
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1 and "Traceback" not in output
    assert "cannot start: TAD_PORT: Input should be a valid integer" in output and "TAD_REJECT_THRESHOLD" in output
    assert "TAD_COMPILED_DECODE_LENGTH: Input should be a valid integer" in output and "TAD_TAD_" not in output
    assert "eighty" not in output  # a value is never echoed: it could be a secret
    process = start_server({"TAD_CORS_ORIGINS": "https://a.example"})  # a list setting that is not JSON
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1 and "Traceback" not in output and "TAD_CORS_ORIGINS" in output
    process = start_server({"TAD_MAX_BATCH": "4"})  # misspelt: pydantic-settings alone would ignore it
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1 and "TAD_MAX_BATCH: no such setting (did you mean TAD_MAX_BATCH_SIZE?)" in output
    process = start_server({"TAD_REJECT_THRESHOLD": "0.5"})  # valid alone; a contradiction names its settings
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1 and "cannot start: TAD_REJECT_THRESHOLD needs TAD_REJECT_METHOD" in output


def test_a_tampered_artifact_stops_the_start(tiny_model_dir: Path, tiny_artifact: Path, tmp_path: Path) -> None:
    import shutil

    artifact = Path(shutil.copytree(tiny_artifact, tmp_path / "artifact"))
    (artifact / "regressor.joblib").write_bytes((artifact / "regressor.joblib").read_bytes() + b"\0")
    env = {"TAD_MODEL": str(tiny_model_dir), "TAD_ARTIFACT_DIR": str(artifact), "TAD_PORT": str(free_port())}
    process = start_server(env)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1 and "sha256 of regressor.joblib" in output


def test_sighup_reloads_the_artifact(tiny_model_dir: Path, tiny_artifact: Path, tmp_path: Path) -> None:
    """operations.md's other way to reload: the signal, as `kill -HUP` sends it to the process."""
    import shutil

    artifact = Path(shutil.copytree(tiny_artifact, tmp_path / "artifact"))
    port = free_port()
    env = {"TAD_MODEL": str(tiny_model_dir), "TAD_ARTIFACT_DIR": str(artifact), "TAD_PORT": str(port)}
    process = start_server(env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, 90, alive=lambda: process.poll() is None)
        before = httpx.get(f"{url}/info", timeout=10).json()["artifact"]["manifest_sha256"]
        manifest = artifact / "manifest.json"
        manifest.write_text(json.dumps(json.loads(manifest.read_text()), indent=1))  # the same, other bytes
        process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while (served := httpx.get(f"{url}/info", timeout=10).json()["artifact"]["manifest_sha256"]) == before:
            assert time.monotonic() < deadline, "SIGHUP did not reload the artifact"
            time.sleep(0.1)
        assert served == file_sha256(manifest)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_a_port_in_use_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        # A model that does not exist: reaching the load would say so instead.
        process = start_server({"TAD_MODEL": str(tmp_path / "missing-model"), "TAD_PORT": str(port)})
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 1
    assert f"tad-serve: cannot start: cannot listen on 127.0.0.1:{port}: it is in use" in output
    assert "missing-model" not in output and "Traceback" not in output


def test_a_signal_arriving_while_the_event_loop_holds_the_runtime_lock_still_drains() -> None:
    """A signal handler interrupts the loop's thread anywhere, inside its runtime-lock sections (every /v1
    request's in-flight count) too: the handler must not take that lock itself, or the process hangs."""
    runtime = Runtime(Settings(artifact_dir=""), ServiceMetrics())
    server = DrainingServer(uvicorn.Config(app=lambda scope, receive, send: None), runtime, grace_s=0.0)

    def signal_inside_the_lock() -> None:
        with runtime._lock:
            server.handle_exit(signal.SIGTERM, None)
            time.sleep(0.2)  # the lock stays held a while after the handler returns, as a request's would

    interrupted = threading.Thread(target=signal_inside_the_lock, daemon=True)
    interrupted.start()
    interrupted.join(timeout=5)
    assert not interrupted.is_alive(), "the signal handler waited for a lock its own thread holds"
    deadline = time.monotonic() + 5
    while not server.should_exit and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.should_exit and runtime.state is State.DRAINING


def test_help_lists_the_settings_and_an_argument_is_refused_before_anything_loads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`python -m app --help` started the server (it read no arguments); a mistyped flag was ignored."""
    with pytest.raises(SystemExit) as exit_info:
        parse_arguments(["--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert "TAD_PORT (default: 8000)" in shown and "TAD_ARTIFACT_DIR (default: " in shown
    assert "TAD_CORS_ORIGINS (default: [])" in shown and "Undefined" not in shown  # a default_factory's value
    with pytest.raises(SystemExit) as exit_info:
        parse_arguments(["--port", "9000"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --port 9000" in capsys.readouterr().err


def wait_for_requests_in_flight(url: str, count: int, timeout: float) -> None:
    """Until the server's `tad_requests_in_flight` gauge reaches `count` (a sleep would only hope it had)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
            if line.startswith("tad_requests_in_flight ") and float(line.split()[1]) >= count:
                return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} requests in flight after {timeout} s")
