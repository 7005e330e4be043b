"""The shipped Prometheus config and alert rules are valid, and a real Prometheus scrapes the service."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from app.settings import Settings
from benchmarks.server_process import free_port
from tests.app.live_server import live_server

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _require(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{binary} is not installed (`make test` installs it: scripts/install_test_packages.sh)")
        pytest.skip(f"{binary} is not installed (apt-get install prometheus)")
    return path


def test_config_and_alert_rules_are_valid_and_the_drift_alert_fires() -> None:
    promtool = _require("promtool")
    for command in (
        ["check", "config", "prometheus.yml"],
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ):
        result = subprocess.run([promtool, *command], cwd=DEPLOY, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


def test_real_prometheus_scrapes_the_service(service_settings: Settings, tmp_path: Path) -> None:
    prometheus = _require("prometheus")
    with live_server(service_settings) as url:
        for _ in range(3):
            body = {"prompt": "the capital of", "max_new_tokens": 3}
            assert httpx.post(f"{url}/v1/generate", json=body, timeout=30).status_code == 200
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: tad\n    static_configs: [{{targets: ['{url.removeprefix('http://')}']}}]\n"
        )
        port = free_port()
        server = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            api = f"http://127.0.0.1:{port}/api/v1"
            deadline = time.monotonic() + 60
            values: dict[str, float] = {}
            while time.monotonic() < deadline and "200" not in values:
                time.sleep(0.5)
                try:
                    answer = httpx.get(f"{api}/query", params={"query": 'tad_requests_total{route="/v1/generate"}'})
                except httpx.TransportError:
                    continue
                for series in answer.json().get("data", {}).get("result", []):
                    values[series["metric"]["status"]] = float(series["value"][1])
            assert values.get("200") == 3.0
            targets = httpx.get(f"{api}/targets").json()["data"]["activeTargets"]
            assert targets[0]["health"] == "up" and targets[0]["lastError"] == ""
        finally:
            server.terminate()
            server.wait(30)
