"""The playground's running score (verdict.js) against the service's own aggregation, in Node.js."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

from app.api.playground import STATIC_DIR
from app.uncertainty.aggregation import Aggregation, aggregate

VERDICT_JS = STATIC_DIR / "verdict.js"
CONFIDENCES = [0.9, 0.5, 0.8, 0.35]


def _running_scores(aggregations: list[str]) -> list[float | None]:
    node = shutil.which("node")
    if node is None:
        pytest.fail("Node.js is missing: `make test` installs it (scripts/install_test_packages.sh)")
    script = f"""
import {{ runningScore }} from {json.dumps(VERDICT_JS.as_uri())};
const tokens = {json.dumps(CONFIDENCES)}.map((c) => ({{ confidence: c, logprob: -0.1, entropy: 0.2 }}));
console.log(JSON.stringify({json.dumps(aggregations)}.map((a) => runningScore("tad", tokens, a))));
"""
    done = subprocess.run(
        [node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout)


def test_the_page_follows_every_aggregation_the_service_computes() -> None:
    names = [a.value for a in Aggregation]
    page = _running_scores(names)
    service = [aggregate(np.array(CONFIDENCES), a) for a in Aggregation]
    assert page == pytest.approx(service)


def test_an_aggregation_the_page_does_not_know_gets_no_running_score() -> None:
    assert _running_scores(["median"]) == [None]
