"""What a change of the quality targets does to the ranking numbers, on answers already generated.

Reads the answers `benchmarks/sampled_answers.py` stored (`--answers`: per dev record the greedy
answer with its quality under the targets of that time and every method's score) and scores each
greedy answer again with the current `training.tasks.score_answer`. Per dataset: how many targets
changed, accuracy before and after, and every method's PRR before and after, with TAD − best
baseline and its paired bootstrap 95% interval. Nothing is generated or fitted: the methods'
scores are those stored, TAD's from the artifact that scored them (fitted on the old targets).

    python -m benchmarks.retarget --answers runs/sampled/answers.jsonl \\
        --data ../shared/data/{squad,mmlu,truthfulqa,triviaqa}_dev.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from app.uncertainty.methods import BASELINES
from training.commands.evaluate import best_baseline
from training.data import read_records
from training.rejection import (
    CORRECT_THRESHOLD,
    accuracy,
    informative,
    interval,
    paired_bootstrap_prr,
    prediction_rejection_ratio,
)
from training.tasks import score_answer

RESAMPLES = 1000


def _scores(rows: list[dict]) -> dict[str, np.ndarray]:
    names = [m.value for m in BASELINES] + ["tad"]
    scores = {
        name: np.asarray([np.nan if (v := row["answers"][0]["scores"].get(name)) is None else v for row in rows])
        for name in names
    }
    return {name: values for name, values in scores.items() if np.isfinite(values).all()}


def _ranking(scores: dict[str, np.ndarray], quality: np.ndarray) -> tuple[dict[str, float], str, np.ndarray]:
    """Every method's PRR, the best baseline, and TAD − best baseline on paired resamples."""
    prr = {name: prediction_rejection_ratio(values, quality) for name, values in scores.items()}
    best = best_baseline(prr)
    draws = paired_bootstrap_prr(scores, quality, resamples=RESAMPLES)
    return prr, best, draws["tad"] - draws[best]


def _cell(value: float, gap: np.ndarray) -> str:
    low_high = interval(gap)
    return f"{value:+.3f} [{low_high[0]:+.2f}, {low_high[1]:+.2f}]" if low_high else f"{value:+.3f}"


def report(rows: list[dict], new_quality: dict[tuple[str, str], float]) -> list[str]:
    lines = [
        "| dataset | n | targets changed | accuracy before → after | TAD before → after "
        "| best baseline before → after | TAD − best before | TAD − best after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    gaps: dict[str, list[np.ndarray]] = {"before": [], "after": []}
    for dataset in sorted({row["dataset"] for row in rows}):
        subset = [row for row in rows if row["dataset"] == dataset]
        old = np.asarray([row["answers"][0]["quality"] for row in subset], dtype=float)
        new = np.asarray([new_quality[(row["dataset"], row["id"])] for row in subset], dtype=float)
        flipped = int(np.sum((old >= CORRECT_THRESHOLD) != (new >= CORRECT_THRESHOLD)))
        changed = int(np.sum(~np.isclose(old, new)))
        scores = _scores(subset)
        prr_old, best_old, gap_old = _ranking(scores, old)
        prr_new, best_new, gap_new = _ranking(scores, new)
        if informative(accuracy(old)):
            gaps["before"].append(gap_old)
        if informative(accuracy(new)):
            gaps["after"].append(gap_new)
        lines.append(
            f"| {dataset} | {len(subset)} | {changed} ({flipped} right/wrong) "
            f"| {accuracy(old):.2f} → {accuracy(new):.2f} | {prr_old['tad']:.3f} → {prr_new['tad']:.3f} "
            f"| {best_old} {prr_old[best_old]:.3f} → {best_new} {prr_new[best_new]:.3f} "
            f"| {_cell(prr_old['tad'] - prr_old[best_old], gap_old)} "
            f"| {_cell(prr_new['tad'] - prr_new[best_new], gap_new)} |"
        )
    for when, parts in gaps.items():
        if parts:
            mean = np.nanmean(np.vstack(parts), axis=0)  # the same resample index is one draw per dataset
            low_high = interval(mean)
            shown = f" [{low_high[0]:+.3f}, {low_high[1]:+.3f}]" if low_high else ""
            lines.append(
                f"mean over the informative datasets ({len(parts)}), TAD − best baseline, targets {when}: "
                f"{np.nanmean(mean):+.3f}{shown}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=Path, required=True, help="the JSONL benchmarks.sampled_answers wrote")
    parser.add_argument("--data", type=Path, nargs="+", required=True, help="the dev JSONL files they answer")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.answers.read_text().splitlines() if line.strip()]
    records = {(item.dataset, item.record.id): item.record for item in read_records(args.data)}
    missing = [key for key in ((row["dataset"], row["id"]) for row in rows) if key not in records]
    if missing:
        raise SystemExit(f"{len(missing)} answered records are not in --data (first: {missing[0]})")
    new_quality = {
        (row["dataset"], row["id"]): score_answer(row["answers"][0]["text"], records[(row["dataset"], row["id"])])
        for row in rows
    }
    print("Greedy chat-style answers scored again with the current targets (PRR; paired bootstrap 95% intervals)")
    print("\n".join(report(rows, new_quality)))


if __name__ == "__main__":
    main()
