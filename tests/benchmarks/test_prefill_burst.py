"""The burst benchmark at its smallest: every mode measured, the ratio printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_burst_on_the_tiny_model_is_timed_whole_and_in_groups() -> None:
    command = [sys.executable, "-m", "benchmarks.prefill_burst", "--model", "tiny-llama", "--threads", "1"]
    sizes = ["--requests", "6", "--prompt-tokens", "8", "--new-tokens", "3", "--chunks", "16", "--repeats", "2"]
    done = subprocess.run([*command, *sizes], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert any(line.startswith("whole (chunk 0)") for line in lines)
    assert any(line.startswith("groups of 16") for line in lines)
    ratio = float(lines[-1].removeprefix("first_token_ratio="))
    assert ratio > 0
