"""The answers of generation runs as training texts, checked to be one model's and each answer once."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training.runs import check_no_duplicates, check_run_folders, iter_texts, read_run_settings, run_dtype
from training.two_stage import FitText


def load_runs(runs: Sequence[Path], n_lags: int | None) -> tuple[list[FitText], dict[str, Any], int]:
    """The runs' texts with `n_lags` lags (None: all the runs store), the first run's settings, and the lags."""
    check_run_folders(runs)
    settings = [read_run_settings(Path(run)) for run in runs]
    first = settings[0]
    for other, run in zip(settings[1:], runs[1:], strict=True):
        if other["model_sha256"] != first["model_sha256"]:
            raise SystemExit(f"run {run} was generated with a different model than {runs[0]}")
        # The artifact records one dtype, the server runs the model in it: the answers must all be its.
        if run_dtype(other) != run_dtype(first):
            raise SystemExit(
                f"run {run} was generated in {run_dtype(other)}, {runs[0]} in {run_dtype(first)}: fit runs of one dtype"
            )
    available = min(s["n_lags"] for s in settings)
    lags = n_lags or available
    if lags > available:
        raise SystemExit(f"--n-lags {lags} exceeds the {available} lags stored in the runs")
    texts, keys = [], []
    for trace in iter_texts(runs):
        texts.append(FitText.from_trace(trace, lags))
        keys.append(trace.answer_key)
    if not texts:
        raise SystemExit("the runs hold no answers (no completed shard, or only shards of skipped records)")
    check_no_duplicates(keys)
    return texts, first, lags
