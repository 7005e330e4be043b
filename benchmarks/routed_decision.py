"""Experiment: a decision routed by the kind of question (docs/experiments/task-routed-decision.md).

A prompt classifier routes each answer to a task route (declared task / prompt style); each route
decides with the score its out-of-fold training answers pick (TAD unless a free score beats it at
95%), mapped to an estimated probability of a wrong answer. Compared with TAD on dev answers.

    python -m benchmarks.routed_decision --artifact models/qwen2.5-coder-1.5b-tad \
        --train /work/runs/qwen-train-chat-0 /work/runs/qwen-train-task-0 \
        --dev-chat /work/runs/qwen-dev-chat /work/runs/qwen-dev-chat-extra \
        --dev-task /work/runs/qwen-dev-task /work/runs/qwen-dev-task-extra
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_predict, cross_val_score
from sklearn.pipeline import Pipeline, make_pipeline
from tqdm import tqdm

from app.uncertainty.aggregation import Aggregation, aggregate
from app.uncertainty.artifact import load_artifact
from app.uncertainty.features import Convention, FeatureSpec
from app.uncertainty.tad import TadScorer
from training.data import QARecord
from training.fit.cross_validation import prepare_folds, stage1_for_stage2
from training.fit.options import FitOptions
from training.method_scores import baseline_table, ranked, uncertainty_table
from training.rejection import CORRECT_THRESHOLD, interval, prediction_rejection_ratio
from training.ridge import fit_ridge
from training.runs import iter_texts
from training.tasks import PromptStyle, build_messages
from training.two_stage import FitText, Variant, cross_stats, stage2_stats

FREE = ("msp", "perplexity", "mean_token_entropy", "max_token_uncertainty", "rauq", "attention_score")
RESAMPLES = 1000
MIN_ROUTE_PROBABILITY = 0.5


@cache
def _lines(path: str) -> list[str]:
    return Path(path).read_text().splitlines()


def prompt_and_route(meta: dict) -> tuple[str, str]:
    record = QARecord.model_validate_json(_lines(meta["file"])[int(meta["line"]) - 1])
    style = PromptStyle(meta.get("prompt_style", PromptStyle.TASK.value))
    return build_messages(record, style)[0]["content"], f"{record.task.value}/{style.value}"


def out_of_fold_tad(texts: list[FitText], artifact_dir: Path) -> np.ndarray:
    """TAD with the committed configuration, each text scored by the model fitted without its fold."""
    manifest = json.loads((artifact_dir / "manifest.json").read_text())
    cv = json.loads((artifact_dir / "report" / "cv.json").read_text())["chosen"]
    spec = FeatureSpec(
        n_lags=manifest["features"]["n_lags"],
        num_layers=manifest["features"]["num_layers"],
        num_heads=manifest["features"]["num_heads"],
        convention=Convention(manifest["features"]["convention"]),
    )
    variant, a1, a2 = Variant(cv["variant"]), float(cv["alpha_stage1"]), float(cv["alpha"])
    options = FitOptions(runs=(), out=Path("."), variants=(variant,), epsilon=manifest["epsilon"])
    data = prepare_folds(texts, spec, options)
    scores = np.zeros(len(texts))
    for f in tqdm(range(data.count), desc="out-of-fold TAD", unit="fold"):
        train, train_folds = data.texts_without(f, texts)
        available = [g for g in range(data.count) if g != f]
        confidences = [stage1_for_stage2(train, train_folds, data, available, a1, variant, spec, options.epsilon)]
        model = fit_ridge(stage2_stats(data.static_without(f), cross_stats(train, confidences, spec), 0, spec), a2)
        scorer = TadScorer(model, spec, options.epsilon)
        for i in np.flatnonzero(data.fold_of == f):
            c = scorer.confidences_of(texts[i].token_trace()) if len(texts[i]) else np.zeros(0)
            scores[i] = ranked(aggregate(c, Aggregation(cv["aggregation"])))
    return scores


def prr(scores: np.ndarray, quality: np.ndarray) -> float:
    return prediction_rejection_ratio(scores, quality)


def paired_gain(a: np.ndarray, b: np.ndarray, quality: np.ndarray, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(quality), size=(RESAMPLES, len(quality)))
    return np.array([prr(a[d], quality[d]) - prr(b[d], quality[d]) for d in draws])


class RoutedDecision:
    def __init__(
        self, prompts: Sequence[str], routes: Sequence[str], scores: dict[str, np.ndarray], quality: np.ndarray
    ):
        self.router: Pipeline = make_pipeline(
            TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2),
            LogisticRegression(max_iter=2000),
        ).fit(prompts, routes)
        routes_arr = np.asarray(routes)
        self.method: dict[str, str] = {}
        self.choice: dict[str, dict] = {}
        self.scale: dict[str, LogisticRegression] = {}
        wrong = (quality < CORRECT_THRESHOLD).astype(int)
        for route in sorted(set(routes)):
            mask = routes_arr == route
            q = quality[mask]
            acc = float(np.mean(q >= CORRECT_THRESHOLD))
            method = "tad"
            record: dict = {"n": int(mask.sum()), "accuracy": acc}
            if 0.1 <= acc <= 0.9:
                route_prr = {m: prr(scores[m][mask], q) for m in ("tad", *FREE)}
                best = max(FREE, key=lambda m: route_prr[m])
                gain = paired_gain(scores[best][mask], scores["tad"][mask], q)
                low, high = interval(gain) or (np.nan, np.nan)
                record.update(
                    prr={k: round(v, 3) for k, v in route_prr.items()},
                    challenger=best,
                    gain=round(route_prr[best] - route_prr["tad"], 3),
                    interval=[round(low, 3), round(high, 3)],
                )
                if low > 0:
                    method = best
            self.method[route] = method
            record["method"] = method
            self.choice[route] = record
            self.scale[route] = LogisticRegression().fit(_column(scores[method][mask]), wrong[mask])
        self.fallback = LogisticRegression().fit(_column(scores["tad"]), wrong)

    def score(self, prompts: Sequence[str], scores: dict[str, np.ndarray]) -> tuple[np.ndarray, list[str]]:
        probabilities = self.router.predict_proba(prompts)
        classes = self.router.classes_
        out = np.zeros(len(prompts))
        used = []
        for i, row in enumerate(probabilities):
            top = int(np.argmax(row))
            if row[top] < MIN_ROUTE_PROBABILITY:
                out[i] = self.fallback.predict_proba(_column(scores["tad"][i : i + 1]))[0, 1]
                used.append("fallback")
                continue
            route = str(classes[top])
            method = self.method[route]
            out[i] = self.scale[route].predict_proba(_column(scores[method][i : i + 1]))[0, 1]
            used.append(route)
        return out, used


def _column(values: np.ndarray) -> np.ndarray:
    return np.nan_to_num(np.asarray(values, dtype=np.float64), posinf=1e6).reshape(-1, 1)


def load(runs: Sequence[Path]) -> tuple[list, list[str], list[str]]:
    texts = list(iter_texts(runs))
    pairs = [prompt_and_route(t.meta) for t in texts]
    return texts, [p for p, _ in pairs], [r for _, r in pairs]


def compare(
    name: str, routed: np.ndarray, scores: dict[str, np.ndarray], quality: np.ndarray, datasets: np.ndarray
) -> dict:
    rows, gains, best_gains = {}, [], []
    for dataset in sorted(set(datasets)):
        mask = datasets == dataset
        q = quality[mask]
        acc = float(np.mean(q >= CORRECT_THRESHOLD))
        if not 0.1 <= acc <= 0.9:
            continue
        free = {m: prr(scores[m][mask], q) for m in FREE}
        best = max(free, key=free.get)
        g = paired_gain(routed[mask], scores["tad"][mask], q)
        gb = paired_gain(routed[mask], scores[best][mask], q)
        gains.append(g)
        best_gains.append(gb)
        rows[dataset] = {
            "n": int(mask.sum()),
            "accuracy": round(acc, 3),
            "tad": round(prr(scores["tad"][mask], q), 3),
            "routed": round(prr(routed[mask], q), 3),
            "best": best,
            "best_prr": round(free[best], 3),
            "routed_minus_tad": round(prr(routed[mask], q) - prr(scores["tad"][mask], q), 3),
            "routed_minus_tad_ci": [round(x, 3) for x in interval(g)],
            "routed_minus_best": round(prr(routed[mask], q) - free[best], 3),
            "routed_minus_best_ci": [round(x, 3) for x in interval(gb)],
        }
    mean_gain = np.mean(np.stack(gains), axis=0)
    mean_best = np.mean(np.stack(best_gains), axis=0)
    summary = {
        "mean_routed_minus_tad": round(float(np.mean([r["routed_minus_tad"] for r in rows.values()])), 3),
        "mean_routed_minus_tad_ci": [round(x, 3) for x in interval(mean_gain)],
        "mean_routed_minus_best": round(float(np.mean([r["routed_minus_best"] for r in rows.values()])), 3),
        "mean_routed_minus_best_ci": [round(x, 3) for x in interval(mean_best)],
    }
    print(f"\n## {name}")
    print("| dataset | n | accuracy | TAD | routed | best free | routed − TAD | routed − best |")
    print("|---|---|---|---|---|---|---|---|")
    for d, r in rows.items():
        cells = [
            d,
            str(r["n"]),
            f"{r['accuracy']:.2f}",
            f"{r['tad']:.3f}",
            f"{r['routed']:.3f}",
            f"{r['best']} {r['best_prr']:.3f}",
            f"{r['routed_minus_tad']:+.3f} {r['routed_minus_tad_ci']}",
            f"{r['routed_minus_best']:+.3f} {r['routed_minus_best_ci']}",
        ]
        print("| " + " | ".join(cells) + " |")
    print(json.dumps(summary))
    return {"datasets": rows, **summary}


def dev_scores(artifact, texts) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    table = uncertainty_table(artifact, texts)
    scores = {m: table[m] for m in ("tad", *FREE)}
    return scores, np.array([t.target for t in texts]), np.array([t.dataset for t in texts])


def dataset_level_diagnostic(
    traces: Sequence, prompts: Sequence[str], scores: dict[str, np.ndarray], quality: np.ndarray
) -> dict:
    """Training answers only: the same rule per dataset/prompt style, and how well a prompt classifier
    tells those groups apart (5-fold CV), i.e. what a router by dataset would have to work with."""
    groups = np.array([t.group for t in traces])
    router = make_pipeline(
        TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2), LogisticRegression(max_iter=2000)
    )
    predicted = cross_val_predict(router, list(prompts), list(groups), cv=5)
    out = {}
    print("\n## by dataset/prompt style (out-of-fold training answers)")
    for group in sorted(set(groups)):
        mask = groups == group
        q = quality[mask]
        acc = float(np.mean(q >= CORRECT_THRESHOLD))
        if not 0.1 <= acc <= 0.9:
            continue
        group_prr = {m: prr(scores[m][mask], q) for m in ("tad", *FREE)}
        best = max(FREE, key=lambda m: group_prr[m])
        low, high = interval(paired_gain(scores[best][mask], scores["tad"][mask], q)) or (np.nan, np.nan)
        out[group] = {
            "tad": round(group_prr["tad"], 3),
            "challenger": best,
            "challenger_prr": round(group_prr[best], 3),
            "interval": [round(low, 3), round(high, 3)],
            "switches": bool(low > 0),
            "router_accuracy": round(float(np.mean(predicted[mask] == group)), 3),
        }
        print(group, json.dumps(out[group]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--artifact", type=Path, required=True)
    parser.add_argument("--train", type=Path, nargs="+", required=True)
    parser.add_argument("--dev-chat", type=Path, nargs="+", required=True)
    parser.add_argument("--dev-task", type=Path, nargs="+", required=True)
    parser.add_argument("--out", type=Path, default=Path("runs/routed-decision"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    artifact = load_artifact(args.artifact)
    traces, prompts, routes = load(args.train)
    lags = artifact.n_lags
    texts = [FitText.from_trace(t, lags) for t in traces]
    cache_path = args.out / "train-scores.npz"
    if cache_path.is_file():
        train_scores = dict(np.load(cache_path))
    else:
        train_scores = {"tad": out_of_fold_tad(texts, args.artifact)}
        train_scores.update({m: v for m, v in baseline_table([t.token_trace() for t in texts]).items() if m in FREE})
        np.savez(cache_path, **train_scores)
    quality = np.array([t.target for t in texts])
    tasks = np.array([r.split("/")[0] for r in routes])
    decision = RoutedDecision(prompts, routes, train_scores, quality)
    print("## routes (out-of-fold training answers)")
    for route, record in decision.choice.items():
        print(route, json.dumps(record))
    # Router accuracy by cross-validation on the training prompts (5 folds).
    router_cv = cross_val_score(decision.router, prompts, routes, cv=5)
    print(f"router CV accuracy {router_cv.mean():.3f} ± {router_cv.std():.3f}")
    results: dict = {"routes": decision.choice, "router_cv_accuracy": float(router_cv.mean())}
    results["by_dataset"] = dataset_level_diagnostic(traces, prompts, train_scores, quality)
    for name, runs in (("chat", args.dev_chat), ("task", args.dev_task)):
        dev_traces, dev_prompts, dev_routes = load(runs)
        scores, dev_quality, datasets = dev_scores(artifact, dev_traces)
        routed, used = decision.score(dev_prompts, scores)
        routing = float(np.mean([u == r for u, r in zip(used, dev_routes, strict=True)]))
        print(f"\n{name}: routed to its own task route {routing:.3f}; fallback {used.count('fallback')}")
        results[name] = compare(f"dev {name}", routed, scores, dev_quality, datasets)
        results[name]["own_route_share"] = routing
        if name == "chat":
            unseen = np.zeros(len(dev_traces))
            dev_tasks = np.array([r.split("/")[0] for r in dev_routes])
            for task in sorted(set(tasks)):
                keep = tasks != task
                without = RoutedDecision(
                    [p for p, k in zip(prompts, keep, strict=True) if k],
                    [r for r, k in zip(routes, keep, strict=True) if k],
                    {m: v[keep] for m, v in train_scores.items()},
                    quality[keep],
                )
                mask = dev_tasks == task
                part, _ = without.score(
                    [p for p, k in zip(dev_prompts, mask, strict=True) if k], {m: v[mask] for m, v in scores.items()}
                )
                unseen[mask] = part
            results["unseen_task_chat"] = compare("dev chat, each task unseen", unseen, scores, dev_quality, datasets)
    (args.out / "result.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
