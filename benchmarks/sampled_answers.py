"""Best of k samples by uncertainty: does picking the least uncertain of k sampled answers beat greedy?

Uncertainty can choose as well as gate. For each dev record, asked as users ask (a chat message
with the bare question), this generates the greedy answer and `k` sampled ones (temperature T,
fixed seeds), scores every answer with the artifact (TAD and every baseline) and with the task's
target, and compares the accuracy of:

- greedy; one sample (the first seed); the oracle (any of the k samples right);
- for each method, the sample with the lowest uncertainty among the k;
- for TAD, the least uncertain among the k samples and the greedy answer.

Differences to greedy come with paired bootstrap 95% intervals (records resampled within each
dataset).

The same samples give a second use of uncertainty: how much the k samples agree with the greedy
answer, as the greedy answer's uncertainty (consistency = 1 - mean token-F1 between the greedy
answer and each sample; fixed before looking: no parameter is fitted on these answers). Its PRR
per dataset is set beside TAD's and the best baseline's, with paired bootstrap intervals of the
differences and their mean over the informative datasets; "consistency, ties by TAD" adds
0.01 x TAD so that answers whose samples agree equally are ordered by TAD.

Answers are cached in `--out` (one JSON line per record), so a rerun resumes.

    python -m benchmarks.best_of --data ../shared/data/squad_dev.jsonl ... --limit 75 --samples 4
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from app.engine.engine import Engine
from app.engine.loading import load_model
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.settings import DEFAULT_ARTIFACT, DEFAULT_CACHE_DIR, DEFAULT_MODEL
from app.uncertainty.answer import AnswerScorer
from app.uncertainty.artifact import load_artifact
from app.uncertainty.features import Convention
from app.uncertainty.methods import BASELINES, METHODS
from training.commands.evaluate import best_baseline
from training.data import LocatedRecord, read_records
from training.rejection import (
    CORRECT_THRESHOLD,
    accuracy,
    informative,
    interval,
    paired_bootstrap_prr,
    prediction_rejection_ratio,
)
from training.targets import token_f1
from training.tasks import PromptStyle, build_prompt, max_new_tokens, score_answer

RESAMPLES = 2000
PRR_RESAMPLES = 1000
TIE_BREAK = 0.01  # TAD lies in [0, 1]: at this weight it only orders answers whose samples agree equally


def _answers(
    engine: Engine, scorer: AnswerScorer, located: Sequence[LocatedRecord], samples: int, temperature: float
) -> list[dict]:
    """Per record: the greedy answer and `samples` sampled ones, each with its quality and every method's score."""
    requests, owners = [], []
    for position, item in enumerate(located):
        prompt = build_prompt(item.record, PromptStyle.BARE)
        ids = tuple(engine.encode_prompt(messages=prompt.messages))
        limit = max_new_tokens(item.record.task, PromptStyle.BARE)
        for draw in range(samples + 1):  # draw 0: greedy
            params = SamplingParams(
                max_new_tokens=limit,
                temperature=0.0 if draw == 0 else temperature,
                seed=None if draw == 0 else draw,
            )
            requests.append(GenerationRequest(prompt_ids=ids, params=params))
            owners.append(position)
    rows: list[dict] = [
        {"dataset": item.dataset, "id": item.record.id, "answers": [None] * (samples + 1)} for item in located
    ]
    for index, sequence in engine.generate_continuously(requests, 16):
        position, draw = owners[index], index % (samples + 1)
        scored = scorer.score(engine.trace(sequence))
        rows[position]["answers"][draw] = {
            "text": sequence.text,
            "quality": score_answer(sequence.text, located[position].record),
            "scores": scored.sequence.as_dict(),
        }
    return rows


def _choice_accuracy(rows: list[dict], method: str | None, with_greedy: bool = False) -> np.ndarray:
    """1/0 per record: whether the answer chosen is right. `method` None: the first sample."""
    correct = []
    for row in rows:
        candidates = row["answers"][1:] if not with_greedy else row["answers"]
        if method is None:
            chosen = candidates[0]
        else:

            def uncertainty(answer: dict) -> float:
                value = answer["scores"].get(method)
                return value if value is not None and np.isfinite(value) else np.inf

            chosen = min(candidates, key=uncertainty)
        correct.append(chosen["quality"] >= CORRECT_THRESHOLD)
    return np.asarray(correct, dtype=float)


def _paired_interval(
    rows: list[dict], choice: np.ndarray, reference: np.ndarray, seed: int = 0
) -> tuple[float, float] | None:
    """95% interval of mean(choice - reference), records resampled within each dataset."""
    rng = np.random.default_rng(seed)
    groups: dict[str, list[int]] = {}
    for index, row in enumerate(rows):
        groups.setdefault(row["dataset"], []).append(index)
    difference = choice - reference
    draws = np.zeros(RESAMPLES)
    for members in groups.values():
        picked = rng.choice(np.asarray(members), size=(RESAMPLES, len(members)))
        draws += difference[picked].sum(axis=1)
    return interval(draws / len(rows))


def _difference(rows: list[dict], choice: np.ndarray, reference: np.ndarray) -> str:
    """Mean accuracy difference with its paired 95% interval, as a table cell."""
    low_high = _paired_interval(rows, choice, reference)
    shown = f" [{low_high[0]:+.3f}, {low_high[1]:+.3f}]" if low_high else ""
    return f"{choice.mean() - reference.mean():+.3f}{shown}"


def report(rows: list[dict]) -> list[str]:
    greedy = np.asarray([row["answers"][0]["quality"] >= CORRECT_THRESHOLD for row in rows], dtype=float)
    oracle = np.asarray(
        [any(a["quality"] >= CORRECT_THRESHOLD for a in row["answers"][1:]) for row in rows], dtype=float
    )
    one_sample = _choice_accuracy(rows, None)
    scored = [m.name for m in METHODS if any(row["answers"][0]["scores"].get(m.name) is not None for row in rows)]
    choices: list[tuple[str, np.ndarray]] = [
        (f"least {name} of the samples", _choice_accuracy(rows, name)) for name in scored
    ]
    choices.append(("least tad of the samples and greedy", _choice_accuracy(rows, "tad", with_greedy=True)))
    datasets = sorted({row["dataset"] for row in rows})
    counts = {d: sum(row["dataset"] == d for row in rows) for d in datasets}
    lines = [
        f"records: {len(rows)} ({', '.join(f'{d} {counts[d]}' for d in datasets)})",
        "| answer chosen | accuracy | − greedy | − one sample |",
        "|---|---|---|---|",
        f"| greedy | {greedy.mean():.3f} | — | — |",
        f"| one sample | {one_sample.mean():.3f} | {_difference(rows, one_sample, greedy)} | — |",
    ]
    for name, correct in choices:
        lines.append(
            f"| {name} | {correct.mean():.3f} | {_difference(rows, correct, greedy)} "
            f"| {_difference(rows, correct, one_sample)} |"
        )
    lines.append(f"| oracle (any sample right) | {oracle.mean():.3f} | {oracle.mean() - greedy.mean():+.3f} | — |")
    for dataset in datasets:
        subset = [row for row in rows if row["dataset"] == dataset]
        base = np.mean([row["answers"][0]["quality"] >= CORRECT_THRESHOLD for row in subset])
        tad = _choice_accuracy(subset, "tad").mean()
        sample = _choice_accuracy(subset, None).mean()
        lines.append(f"{dataset}: greedy {base:.3f}, one sample {sample:.3f}, least tad of the samples {tad:.3f}")
    return lines


def consistency(row: dict) -> float:
    """1 - mean token-F1 between the greedy answer and each sample: 0 when every sample says the same."""
    greedy = row["answers"][0]["text"]
    return 1.0 - float(np.mean([token_f1(greedy, sample["text"]) for sample in row["answers"][1:]]))


def _greedy_scores(rows: list[dict]) -> dict[str, np.ndarray]:
    """Every method's uncertainty of each greedy answer, the two consistency scores beside them."""
    names = [m.value for m in BASELINES] + ["tad"]
    scores = {
        name: np.asarray(
            [np.nan if (v := row["answers"][0]["scores"].get(name)) is None else v for row in rows], dtype=float
        )
        for name in names
    }
    scores["consistency"] = np.asarray([consistency(row) for row in rows])
    scores["consistency_tad"] = scores["consistency"] + TIE_BREAK * scores["tad"]
    return {name: values for name, values in scores.items() if np.isfinite(values).all()}


def consistency_report(rows: list[dict]) -> list[str]:
    """PRR of the greedy answers under consistency, TAD and the best baseline, per dataset."""
    lines = [
        "| dataset | n | accuracy | TAD | best baseline | consistency | consistency, ties by TAD "
        "| consistency − best baseline | consistency, ties by TAD − best baseline | TAD − best baseline |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    differences: dict[str, list[np.ndarray]] = {"consistency": [], "consistency_tad": [], "tad": []}
    for dataset in sorted({row["dataset"] for row in rows}):
        subset = [row for row in rows if row["dataset"] == dataset]
        quality = np.asarray([row["answers"][0]["quality"] for row in subset])
        scores = _greedy_scores(subset)
        prr = {name: prediction_rejection_ratio(values, quality) for name, values in scores.items()}
        best = best_baseline(prr)
        draws = paired_bootstrap_prr(scores, quality, resamples=PRR_RESAMPLES)
        cells = []
        for name in differences:
            gap = draws[name] - draws[best]
            low_high = interval(gap)
            cells.append(f"{prr[name] - prr[best]:+.3f} [{low_high[0]:+.2f}, {low_high[1]:+.2f}]" if low_high else "—")
            if informative(accuracy(quality)):
                differences[name].append(gap)
        lines.append(
            f"| {dataset} | {len(subset)} | {accuracy(quality):.2f} | {prr['tad']:.3f} | {best} {prr[best]:.3f} "
            f"| {prr['consistency']:.3f} | {prr['consistency_tad']:.3f} | {' | '.join(cells)} |"
        )
    for name, gaps in differences.items():
        if gaps:
            mean = np.nanmean(np.vstack(gaps), axis=0)  # the same resample index is one draw per dataset
            low_high = interval(mean)
            shown = f"[{low_high[0]:+.3f}, {low_high[1]:+.3f}]" if low_high else ""
            lines.append(f"mean over the informative datasets, {name} − best baseline: {np.nanmean(mean):+.3f} {shown}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, nargs="+", required=True, help="dev JSONL files")
    parser.add_argument("--limit", type=int, default=75, help="records per file")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--out", type=Path, default=Path("runs/best_of.jsonl"))
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    args = parser.parse_args()

    done = {}
    if args.out.is_file():
        done = {(row["dataset"], row["id"]): row for row in map(json.loads, args.out.read_text().splitlines())}
    wanted = list(read_records(args.data, limit=args.limit))
    # Datasets interleaved, so a run stopped early still covers every dataset about equally.
    seen: Counter[str] = Counter()
    turns = []
    for item in wanted:
        turns.append(seen[item.dataset])
        seen[item.dataset] += 1
    order = [item for _, item in sorted(zip(turns, wanted, strict=True), key=lambda pair: pair[0])]
    missing = [item for item in order if (item.dataset, item.record.id) not in done]
    if missing:
        artifact = load_artifact(args.artifact)
        loaded = load_model(args.model, cache_dir=args.cache_dir)
        artifact.check_model(loaded.identity)
        engine = Engine(loaded, n_lags=artifact.n_lags, last_row=artifact.convention is Convention.CONSUMING)
        scorer = AnswerScorer(artifact)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        for start in range(0, len(missing), 25):  # a chunk at a time, so an interrupted run resumes
            chunk = missing[start : start + 25]
            rows = _answers(engine, scorer, chunk, args.samples, args.temperature)
            with args.out.open("a") as sink:
                for row in rows:
                    sink.write(json.dumps(row) + "\n")
                    done[(row["dataset"], row["id"])] = row
            print(f"{min(start + 25, len(missing))}/{len(missing)} records generated", flush=True)
    rows = [done[(item.dataset, item.record.id)] for item in wanted]
    print(f"k = {args.samples} samples at temperature {args.temperature}; greedy beside them; chat-style prompts")
    print("\n".join(report(rows)))
    print()
    print("Sample consistency as the greedy answer's uncertainty (PRR; paired bootstrap 95% intervals)")
    print("\n".join(consistency_report(rows)))


if __name__ == "__main__":
    main()
