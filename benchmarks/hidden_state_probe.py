"""A feature family beyond TAD, measured: a linear probe on the model's hidden states.

For every stored answer of the runs, one teacher-forced forward over the same prompt (rebuilt
from the record, checked against the run's prompt length) and answer gives the hidden states
of a few layers at three places: the last prompt token (before answering), the mean over the
positions that generate the answer's tokens, and the answer's last token. A standardised
logistic regression on one place and layer predicts "the answer is right"; the place, layer
and regularisation are chosen by 5-fold cross-validation on the training runs (mean PRR within
each informative dataset), never on dev. The chosen probe is then fitted on all training
answers and compared on the dev runs, dataset by dataset, with the artifact's TAD and every
baseline (paired bootstrap 95% intervals of probe − best baseline and TAD − best baseline).

    python -m benchmarks.hidden_state_probe --train RUN [RUN ...] --dev RUN [RUN ...] \
        [--artifact DIR] [--features-dir DIR]

Features are cached per run in --features-dir (one .npz per run), so a rerun only refits.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from tqdm import tqdm

from app.engine.engine import Engine
from app.engine.loading import load_model
from app.settings import DEFAULT_ARTIFACT, DEFAULT_CACHE_DIR
from app.uncertainty.artifact import load_artifact
from training.commands.evaluate import best_baseline, mean_interval
from training.data import read_records
from training.groups import mean_prr_within
from training.rejection import (
    CORRECT_THRESHOLD,
    accuracy,
    informative,
    interval,
    paired_bootstrap_prr,
    prediction_rejection_ratio,
)
from training.runs import TextTrace, check_run_folders, iter_texts, read_run_settings
from training.scoring import uncertainty_table
from training.targets import TARGETS_VERSION
from training.tasks import PromptStyle, build_prompt

# Hidden-state indices (0 = embeddings, the model's last layer = num_layers); SmolLM2-135M has 30 layers.
LAYERS = (4, 8, 12, 16, 20, 24, 30)
PLACES = ("last_prompt", "mean_generating", "last_answer")
INVERSE_REGULARISATION = (0.005, 0.05, 0.5)


@dataclass(frozen=True)
class RunFeatures:
    keys: np.ndarray
    targets: np.ndarray
    datasets: np.ndarray
    places: dict[str, np.ndarray]  # place -> [texts, layers, hidden]


def _cache_path(features_dir: Path, run: Path) -> Path:
    # The cache holds the targets too: a rescored run (a new targets version) gets a new cache.
    key = f"{run.resolve()}:{TARGETS_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return features_dir / f"{run.name}-{digest}.npz"


def extract(run: Path, engine: Engine, layers: Sequence[int]) -> RunFeatures:
    texts: list[TextTrace] = list(iter_texts([run]))
    files = sorted({str(t.meta["file"]) for t in texts})
    records = {(str(r.path), r.line): r for r in read_records([Path(f) for f in files])}
    model = engine.loaded.model
    places: dict[str, list[np.ndarray]] = {place: [] for place in PLACES}
    for text in tqdm(texts, desc=f"hidden states {run.name}", unit="text"):
        located = records[(str(text.meta["file"]), int(text.meta["line"]))]
        prompt = build_prompt(located.record, PromptStyle(text.meta["prompt_style"]), ())
        prompt_ids = engine.encode_prompt(prompt=prompt.text, messages=prompt.messages)
        if len(prompt_ids) != text.meta["prompt_tokens"]:
            raise SystemExit(f"{text.key}: the prompt no longer encodes as it did when {run} was generated")
        answer = [int(token) for token in text.token_ids]
        ids = torch.tensor([prompt_ids + answer], device=engine.loaded.device)
        with torch.no_grad():
            hidden = model(ids, output_hidden_states=True).hidden_states
        chosen = torch.stack([hidden[layer][0] for layer in layers]).float().cpu()  # [layers, tokens, hidden]
        last_prompt = len(prompt_ids) - 1
        # Position p - 1 + i generates answer token i (the generating convention, docs/method.md §2).
        places["last_prompt"].append(chosen[:, last_prompt].numpy())
        places["mean_generating"].append(chosen[:, last_prompt : last_prompt + max(len(answer), 1)].mean(1).numpy())
        places["last_answer"].append(chosen[:, last_prompt + len(answer)].numpy())
    return RunFeatures(
        keys=np.array([t.key for t in texts]),
        targets=np.array([t.target for t in texts], dtype=np.float64),
        datasets=np.array([t.dataset for t in texts]),
        places={place: np.stack(values).astype(np.float32) for place, values in places.items()},
    )


def features_of(runs: Sequence[Path], engine_for: Callable[[], Engine], features_dir: Path) -> RunFeatures:
    parts = []
    for run in runs:
        cache = _cache_path(features_dir, run)
        if cache.is_file():
            data = np.load(cache)
            parts.append(
                RunFeatures(data["keys"], data["targets"], data["datasets"], {place: data[place] for place in PLACES})
            )
            continue
        features = extract(run, engine_for(), LAYERS)
        features_dir.mkdir(parents=True, exist_ok=True)
        arrays = {"keys": features.keys, "targets": features.targets, "datasets": features.datasets, **features.places}
        np.savez(cache, **arrays)  # type: ignore[arg-type]  # numpy types **kwds as its allow_pickle flag
        parts.append(features)
    return RunFeatures(
        keys=np.concatenate([p.keys for p in parts]),
        targets=np.concatenate([p.targets for p in parts]),
        datasets=np.concatenate([p.datasets for p in parts]),
        places={place: np.concatenate([p.places[place] for p in parts]) for place in PLACES},
    )


def probe(inverse_regularisation: float) -> Pipeline:
    return make_pipeline(StandardScaler(), LogisticRegression(C=inverse_regularisation, max_iter=2000))


def within_dataset_prr(uncertainty: np.ndarray, features: RunFeatures) -> float:
    """Mean PRR within each informative dataset (accuracy in [0.1, 0.9]), as `fit` selects."""
    names = {
        name
        for name in np.unique(features.datasets)
        if informative(accuracy(features.targets[features.datasets == name]))
    }
    return mean_prr_within(uncertainty, features.targets, features.datasets, frozenset(names))


def choose_probe(train: RunFeatures) -> tuple[float, str, int, float]:
    """(CV PRR within datasets, place, layer, C) of the best probe by 5-fold CV on the training answers."""
    right = (train.targets >= CORRECT_THRESHOLD).astype(int)
    folds = StratifiedKFold(5, shuffle=True, random_state=0)
    trials = []
    for place in PLACES:
        for index, layer in enumerate(LAYERS):
            for c in INVERSE_REGULARISATION:
                held_out = cross_val_predict(
                    probe(c), train.places[place][:, index], right, cv=folds, method="predict_proba"
                )[:, 1]
                score = within_dataset_prr(1.0 - held_out, train)
                print(f"cv {place:16s} layer {layer:2d} C {c:<6g} within-dataset PRR {score:.3f}", flush=True)
                trials.append((score, place, layer, c))
    return max(trials)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=Path, nargs="+", required=True, help="generation runs to fit the probe on")
    parser.add_argument("--dev", type=Path, nargs="+", required=True, help="generation runs to compare on")
    parser.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT, help="its TAD and baselines are compared")
    parser.add_argument("--features-dir", type=Path, default=Path("runs/hidden-states"))
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    args = parser.parse_args()

    check_run_folders([*args.train, *args.dev])  # runs whose targets are current (else: rescore them)
    models = {read_run_settings(run)["model"] for run in [*args.train, *args.dev]}
    if len(models) != 1:
        raise SystemExit(f"the runs were made with different models: {sorted(models)}")
    engine: list[Engine] = []

    def engine_for() -> Engine:
        if not engine:  # loaded only when some run's features are not cached yet
            engine.append(Engine(load_model(models.pop(), cache_dir=args.cache_dir), n_lags=1))
        return engine[0]

    train = features_of(args.train, engine_for, args.features_dir)
    dev = features_of(args.dev, engine_for, args.features_dir)
    cv_score, place, layer, c = choose_probe(train)
    print(f"chosen by CV on the training answers: {place}, layer {layer}, C {c:g} (within-dataset PRR {cv_score:.3f})")
    index = LAYERS.index(layer)
    fitted = probe(c).fit(train.places[place][:, index], (train.targets >= CORRECT_THRESHOLD).astype(int))

    texts = list(iter_texts(args.dev))
    if [t.key for t in texts] != list(dev.keys):
        raise SystemExit(f"cached features in {args.features_dir} do not match the dev runs: delete them")
    table = uncertainty_table(load_artifact(args.artifact), texts)
    scores = {name: values for name, values in table.items() if name == "tad" or not name.startswith("tad")}
    scores["probe"] = 1.0 - fitted.predict_proba(dev.places[place][:, index])[:, 1]
    gaps: dict[str, list[float]] = {"probe": [], "tad": []}
    resampled: dict[str, list[np.ndarray]] = {"probe": [], "tad": []}
    print("\n| dataset | n | accuracy | probe | TAD | best baseline | probe − best | TAD − best |")
    print("|---|---|---|---|---|---|---|---|")
    for name in np.unique(dev.datasets):
        mask = dev.datasets == name
        quality = dev.targets[mask]
        if not informative(accuracy(quality)):
            continue
        prr = {method: prediction_rejection_ratio(values[mask], quality) for method, values in scores.items()}
        best = best_baseline(prr)
        boot = paired_bootstrap_prr({m: scores[m][mask] for m in ("probe", "tad", best)}, quality)
        cells = []
        for method in gaps:
            gaps[method].append(prr[method] - prr[best])
            resampled[method].append(boot[method] - boot[best])
            low, high = interval(boot[method] - boot[best]) or (float("nan"), float("nan"))
            cells.append(f"{prr[method] - prr[best]:+.3f} [{low:.2f}, {high:.2f}]")
        print(
            f"| {name} | {mask.sum()} | {accuracy(quality):.2f} | {prr['probe']:.3f} | {prr['tad']:.3f} "
            f"| {best} {prr[best]:.3f} | {cells[0]} | {cells[1]} |"
        )
    for method, values in gaps.items():
        low, high = mean_interval(resampled[method]) or (float("nan"), float("nan"))
        mean = float(np.mean(values))
        print(f"mean {method} − best baseline over the informative datasets: {mean:+.3f} [{low:.2f}, {high:.2f}]")


if __name__ == "__main__":
    main()
