"""What a change of the quality targets does to the ranking numbers, on answers already generated.

Reads the answers `benchmarks/sampled_answers.py` stored (`--answers`: per dev record the greedy
answer with its quality under the targets of that time and every method's score) and scores each
greedy answer again with the current `training.tasks.score_answer`. Per dataset: how many targets
changed, accuracy before and after, and every method's PRR before and after, with TAD − best
baseline and its paired bootstrap 95% interval. Nothing is generated or fitted: the methods'
scores are those stored, TAD's from the artifact that scored them (fitted on the old targets).

    python -m benchmarks.retarget --answers runs/sampled/answers.jsonl \\
        --data ../shared/data/{squad,mmlu,truthfulqa,triviaqa}_dev.jsonl

With `--artifacts OLD NEW`, the same greedy answers are also scored again, teacher-forced as
/v1/score does (their text re-tokenized after the bare prompt), under each artifact, and each
one's TAD is compared with the baselines and with the first artifact's TAD under the current
targets (paired bootstrap over the same answers).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from tqdm import tqdm

from app.engine.engine import Engine
from app.engine.loading import load_model
from app.settings import DEFAULT_CACHE_DIR, DEFAULT_MODEL
from app.uncertainty.answer import AnswerScorer
from app.uncertainty.artifact import load_artifact
from app.uncertainty.methods import BASELINES
from training.commands.evaluate import best_baseline, mean_interval
from training.data import QARecord, read_records
from training.rejection import (
    CORRECT_THRESHOLD,
    accuracy,
    informative,
    interval,
    paired_bootstrap_prr,
    prediction_rejection_ratio,
)
from training.tasks import PromptStyle, build_prompt, score_answer

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
    lines += [_mean_line(f"TAD − best baseline, targets {when}", parts) for when, parts in gaps.items() if parts]
    return lines


def _mean_line(label: str, parts: list[np.ndarray]) -> str:
    """A difference's mean over the informative datasets, from each one's paired bootstrap draws."""
    low_high = mean_interval(parts)
    shown = f" [{low_high[0]:+.3f}, {low_high[1]:+.3f}]" if low_high else ""
    mean = float(np.nanmean(np.mean(np.stack(parts), axis=0)))  # one draw: the same resample index per dataset
    return f"mean over the informative datasets ({len(parts)}), {label}: {mean:+.3f}{shown}"


def teacher_forced_scores(
    rows: list[dict], records: dict[tuple[str, str], QARecord], artifacts: list[Path], model: str, batch: int = 16
) -> dict[str, dict[tuple[str, str], dict[str, float | None]]]:
    """Per artifact (by folder name), per answer: every method's score of its greedy answer, teacher-forced."""
    loaded_artifacts = [load_artifact(path) for path in artifacts]
    lags = {artifact.n_lags for artifact in loaded_artifacts}
    if len(lags) != 1:
        raise SystemExit(f"the artifacts read different lag counts {sorted(lags)}: compare them one engine each")
    loaded = load_model(model, cache_dir=DEFAULT_CACHE_DIR)
    for artifact in loaded_artifacts:
        artifact.check_model(loaded.identity)
    engine = Engine(loaded, n_lags=lags.pop())
    keys = [(row["dataset"], row["id"]) for row in rows]
    pairs = []
    for row, key in zip(rows, keys, strict=True):
        prompt = build_prompt(records[key], PromptStyle.BARE)
        pairs.append(
            (engine.encode_prompt(messages=prompt.messages), engine.encode_response(row["answers"][0]["text"]))
        )
    traces = []
    for start in tqdm(range(0, len(pairs), batch), desc="teacher-forced scoring", unit="batch"):
        traces.extend(engine.score(pairs[start : start + batch]))
    return {
        path.name: {
            key: AnswerScorer(artifact).score(trace).sequence.as_dict() for key, trace in zip(keys, traces, strict=True)
        }
        for path, artifact in zip(artifacts, loaded_artifacts, strict=True)
    }


def artifacts_report(
    rows: list[dict], new_quality: dict[tuple[str, str], float], scored: dict[str, dict[tuple[str, str], dict]]
) -> list[str]:
    names = list(scored)
    first = names[0]
    header = " | ".join(f"TAD {name}" for name in names)
    others = names[1:]
    lines = [
        f"| dataset | n | accuracy | {header} | best baseline | "
        + " | ".join([*(f"{name} − {first}" for name in others), *(f"{name} − best" for name in names)])
        + " |",
        "|---|---|---|" + "---|" * (len(names) + 1 + len(others) + len(names)),
    ]
    labels = [*(f"{name} − {first}" for name in others), *(f"{name} − best" for name in names)]
    gaps: dict[str, list[np.ndarray]] = {label: [] for label in labels}
    for dataset in sorted({row["dataset"] for row in rows}):
        keys = [(row["dataset"], row["id"]) for row in rows if row["dataset"] == dataset]
        quality = np.asarray([new_quality[key] for key in keys], dtype=float)
        baseline_scores = {m.value: np.asarray([scored[first][key][m.value] for key in keys]) for m in BASELINES}
        scores = {name: values for name, values in baseline_scores.items() if np.isfinite(values).all()}
        for name in names:
            scores[f"tad:{name}"] = np.asarray([scored[name][key]["tad"] for key in keys])
        prr = {name: prediction_rejection_ratio(values, quality) for name, values in scores.items()}
        best = best_baseline({k: v for k, v in prr.items() if not k.startswith("tad:")})
        draws = paired_bootstrap_prr(scores, quality, resamples=RESAMPLES)
        cells = []
        for name in others:
            gap = draws[f"tad:{name}"] - draws[f"tad:{first}"]
            cells.append(_cell(prr[f"tad:{name}"] - prr[f"tad:{first}"], gap))
            if informative(accuracy(quality)):
                gaps[f"{name} − {first}"].append(gap)
        for name in names:
            gap = draws[f"tad:{name}"] - draws[best]
            cells.append(_cell(prr[f"tad:{name}"] - prr[best], gap))
            if informative(accuracy(quality)):
                gaps[f"{name} − best"].append(gap)
        tads = " | ".join(f"{prr[f'tad:{name}']:.3f}" for name in names)
        lines.append(
            f"| {dataset} | {len(keys)} | {accuracy(quality):.2f} | {tads} | {best} {prr[best]:.3f} "
            f"| {' | '.join(cells)} |"
        )
    lines += [_mean_line(label, parts) for label, parts in gaps.items() if parts]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--answers", type=Path, required=True, help="the JSONL benchmarks.sampled_answers wrote")
    parser.add_argument("--data", type=Path, nargs="+", required=True, help="the dev JSONL files they answer")
    parser.add_argument("--artifacts", type=Path, nargs="*", default=[], help="score the answers again under each")
    parser.add_argument("--model", default=DEFAULT_MODEL)
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
    if args.artifacts:
        scored = teacher_forced_scores(rows, records, args.artifacts, args.model)
        print()
        print(
            "The same answers teacher-forced under each artifact, current targets (PRR; paired bootstrap 95% intervals)"
        )
        print("\n".join(artifacts_report(rows, new_quality, scored)))


if __name__ == "__main__":
    main()
