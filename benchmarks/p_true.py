"""Experiment: P(True), the model asked whether its own answer is correct (docs/experiments/p-true.md).

Scores the chat-style dev answers of the six informative datasets and the made-up-premise answers,
and compares P(True)'s PRR with the free scores' and TAD's (paired bootstrap over answers).

    python -m benchmarks.p_true --artifact models/qwen2.5-coder-1.5b-tad \
        --dev /work/runs/qwen-dev-chat /work/runs/qwen-dev-chat-extra --out /work/runs/p-true
"""

from __future__ import annotations

import argparse
import json
from functools import cache
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from app.engine.engine import Engine
from app.engine.loading import load_model
from app.engine.sampling import SamplingParams
from app.engine.sequence import GenerationRequest
from app.settings import DEFAULT_CACHE_DIR, DEFAULT_MODEL
from app.uncertainty.artifact import load_artifact
from training.data import QARecord
from training.method_scores import baseline_table, uncertainty_table
from training.rejection import CORRECT_THRESHOLD, interval, prediction_rejection_ratio
from training.runs import iter_texts
from training.tasks import PromptStyle, build_messages

INFORMATIVE = ("squad", "mmlu", "truthfulqa", "triviaqa", "nq_open", "gsm8k")
FREE = ("msp", "perplexity", "mean_token_entropy", "max_token_uncertainty", "rauq", "attention_score")
QUESTIONS = Path(__file__).parent / "data" / "false_premises.jsonl"
CHECK = "Question: {question}\nProposed answer: {answer}\nIs the proposed answer correct? Answer yes or no."
RESAMPLES = 1000
BATCH = 8


@cache
def _lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def user_turn(meta: dict) -> str:
    record = QARecord.model_validate_json(_lines(meta["file"])[int(meta["line"]) - 1])
    return build_messages(record, PromptStyle.CHAT)[0]["content"]


def first_tokens(engine: Engine, words: tuple[str, ...]) -> list[int]:
    tokenizer = engine.loaded.tokenizer
    return sorted({tokenizer.encode(w, add_special_tokens=False)[0] for w in words})


def p_true_scores(engine: Engine, pairs: list[tuple[str, str]]) -> np.ndarray:
    """P(no) / (P(yes) + P(no)) for each (question, answer), batched by length, left-padded."""
    yes = first_tokens(engine, ("Yes", "yes", " Yes", " yes", "YES"))
    no = first_tokens(engine, ("No", "no", " No", " no", "NO"))
    ids = [
        engine.encode_prompt(messages=[{"role": "user", "content": CHECK.format(question=q, answer=a)}])
        for q, a in pairs
    ]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    scores = np.zeros(len(ids))
    model, pad = engine.loaded.model, engine.context.pad_token_id
    for start in tqdm(range(0, len(order), BATCH), desc="P(True)", unit="batch"):
        chunk = order[start : start + BATCH]
        width = max(len(ids[i]) for i in chunk)
        inputs = torch.tensor([[pad] * (width - len(ids[i])) + ids[i] for i in chunk])
        mask = torch.tensor([[0] * (width - len(ids[i])) + [1] * len(ids[i]) for i in chunk])
        with torch.inference_mode():
            logits = model(input_ids=inputs, attention_mask=mask, logits_to_keep=1).logits[:, -1].float()
        probs = torch.softmax(logits, dim=-1)
        p_yes, p_no = probs[:, yes].sum(-1), probs[:, no].sum(-1)
        for row, i in enumerate(chunk):
            scores[i] = float(p_no[row] / (p_yes[row] + p_no[row]))
    return scores


def prr(scores: np.ndarray, quality: np.ndarray) -> float:
    return prediction_rejection_ratio(scores, quality)


def gain(a: np.ndarray, b: np.ndarray, quality: np.ndarray, seed: int = 0) -> tuple[float, list[float] | None]:
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(quality), size=(RESAMPLES, len(quality)))
    diffs = np.array([prr(a[d], quality[d]) - prr(b[d], quality[d]) for d in draws])
    bounds = interval(diffs)
    return prr(a, quality) - prr(b, quality), None if bounds is None else [float(x) for x in bounds]


def mean_gain(a: dict, b: dict, quality: dict, seed: int = 0) -> tuple[float, list[float] | None]:
    """Mean over datasets of PRR(a) - PRR(b), resampling each dataset's answers (paired)."""
    rng = np.random.default_rng(seed)
    estimate = float(np.mean([prr(a[d], quality[d]) - prr(b[d], quality[d]) for d in quality]))
    draws = []
    for _ in range(RESAMPLES):
        values = []
        for d, q in quality.items():
            idx = rng.integers(0, len(q), size=len(q))
            values.append(prr(a[d][idx], q[idx]) - prr(b[d][idx], q[idx]))
        draws.append(np.mean(values))
    bounds = interval(np.array(draws))
    return estimate, None if bounds is None else [float(x) for x in bounds]


def false_premises(engine: Engine) -> list[dict]:
    rows = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    requests = [
        GenerationRequest(
            prompt_ids=tuple(engine.encode_prompt(messages=[{"role": "user", "content": r["question"]}])),
            params=SamplingParams(max_new_tokens=64),
        )
        for r in rows
    ]
    answers = [engine.decode([t.token_id for t in s.tokens]).strip() for s in engine.generate(requests)]
    scores = p_true_scores(engine, [(r["question"], a) for r, a in zip(rows, answers, strict=True)])
    return [{"id": r["id"], "answer": a, "p_true": float(s)} for r, a, s in zip(rows, answers, scores, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", type=Path, required=True)
    parser.add_argument("--dev", type=Path, nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    artifact = load_artifact(args.artifact)
    loaded = load_model(DEFAULT_MODEL, dtype="bfloat16", cache_dir=DEFAULT_CACHE_DIR)
    engine = Engine(loaded, n_lags=0)
    texts = [t for t in iter_texts(args.dev) if t.meta["dataset"] in INFORMATIVE]
    cached = args.out / "dev_scores.json"
    if cached.is_file():
        p_true = np.array(json.loads(cached.read_text()))
    else:
        p_true = p_true_scores(engine, [(user_turn(t.meta), t.meta["answer"]) for t in texts])
        cached.write_text(json.dumps(p_true.tolist()))
    table = {**uncertainty_table(artifact, texts), **baseline_table([t.token_trace() for t in texts])}
    scores = {"p_true": p_true, "tad": table["tad"], **{m: table[m] for m in FREE}}
    quality = np.array([t.target for t in texts])
    datasets = np.array([t.meta["dataset"] for t in texts])
    results: dict = {"by_dataset": {}}
    best_free_scores, q_by, p_by, tad_by = {}, {}, {}, {}
    for d in INFORMATIVE:
        m = datasets == d
        q = quality[m]
        prrs = {k: prr(v[m], q) for k, v in scores.items()}
        best = max(FREE, key=lambda k: prrs[k])
        vs_best, vs_best_ci = gain(scores["p_true"][m], scores[best][m], q)
        vs_tad, vs_tad_ci = gain(scores["p_true"][m], scores["tad"][m], q)
        correct = q >= CORRECT_THRESHOLD
        results["by_dataset"][d] = {
            "n": int(m.sum()),
            "accuracy": float(np.mean(correct)),
            "prr": {k: round(v, 3) for k, v in prrs.items()},
            "best_free": best,
            "p_true_minus_best_free": [round(vs_best, 3), vs_best_ci],
            "p_true_minus_tad": [round(vs_tad, 3), vs_tad_ci],
            "correct_scored_above_0.5": float(np.mean(scores["p_true"][m][correct] > 0.5)),
            "wrong_scored_above_0.5": float(np.mean(scores["p_true"][m][~correct] > 0.5)),
        }
        best_free_scores[d], q_by[d], p_by[d], tad_by[d] = scores[best][m], q, scores["p_true"][m], scores["tad"][m]
    results["mean_p_true_minus_best_free"] = mean_gain(p_by, best_free_scores, q_by)
    results["mean_p_true_minus_tad"] = mean_gain(p_by, tad_by, q_by)
    results["false_premises"] = false_premises(engine)
    results["false_premises_scored_above_0.5"] = sum(r["p_true"] > 0.5 for r in results["false_premises"])
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({k: v for k, v in results.items() if k != "false_premises"}, indent=2))
    for r in results["false_premises"]:
        print(f"{r['id']} {r['p_true']:.3f} {r['answer'][:90]!r}")


if __name__ == "__main__":
    main()
