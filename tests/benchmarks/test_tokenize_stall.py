"""The tokenize-stall benchmark at its smallest: a server started, long prompts refused, both latencies printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_long_prompts_are_refused_and_the_health_probes_timed_around_them() -> None:
    command = [sys.executable, "-m", "benchmarks.tokenize_stall", "--requests", "2", "--chars", "40000"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("long prompts: 2 of 40,000 characters")
    assert lines[1].startswith("/health, server quiet:") and lines[2].startswith("/health, during the long prompts:")
    assert float(lines[-1].removeprefix("stall_ratio=").split()[0]) > 0
