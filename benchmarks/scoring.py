"""What scoring one answer costs on the host: TAD's recurrent scorer and the baselines.

The server scores every answer on its worker thread, between decode steps, so this time is
taken from generation (on the GPU the loop is host-bound: docs/performance.md, GPU).
For the default model's artifact (its real regressor) and for random linear regressors of
the real shapes of larger models, it times, interleaved and repeated:

- feature vector: the recurrent scorer building each token's stage-2 vector and taking
  its dot product with the weights (how every artifact was scored before the split);
- split weights:  the scorer as it runs now (`LinearStage2`: the weights split by what they
  multiply, the terms that need no confidence (the step rows as captured, the earlier p's, p_i)
  for the whole answer in matrix products, then the recurrence over the earlier c's token by
  token; for an MLP stage 2, `MLPStage2`: its first layer split the same way);
- whole answer:   everything the server computes when an answer ends (TAD with split
  weights, then MSP, perplexity, entropy, maximum token uncertainty and RAUQ);
- streamed:       split weights fed one token at a time, as a streamed or early-stopped
  answer is scored (each token's confidence the step it is sampled): an MLP's attention
  products then come one row at a time instead of one matrix product per answer.

`--stage2 mlp` gives the larger shapes random MLP stage 2s of the SmolLM2 artifact's size
(two hidden layers of 256) in place of linear ones.

Prints microseconds per token (medians) and the speed-up; the last line is
`scoring_speedup=<smallest feature-vector / split-weights ratio over the shapes>`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sklearn.linear_model import Ridge
from sklearn.neural_network import MLPRegressor

from app.settings import DEFAULT_ARTIFACT
from app.uncertainty.aggregation import Aggregation
from app.uncertainty.artifact import load_artifact
from app.uncertainty.features import Convention, FeatureSpec
from app.uncertainty.methods import MethodInput, score_all
from app.uncertainty.tad import Regressor, TadScorer
from app.uncertainty.trace import TokenTrace

# (name, layers, query heads) of the real configs the GPU benchmark uses.
LARGER_SHAPES: tuple[tuple[str, int, int], ...] = (
    ("Llama-3.1-8B shape", 32, 32),
    ("Qwen2.5-7B shape", 28, 28),
    ("Gemma-2-9B shape", 42, 16),
)


@dataclass(frozen=True)
class Linear:
    """A linear stage-2 model as scikit-learn's ridge shows it (the scorer splits its weights)."""

    coef_: np.ndarray
    intercept_: float

    def predict(self, features: np.ndarray) -> np.ndarray:
        return features.astype(np.float64) @ self.coef_ + self.intercept_


@dataclass(frozen=True)
class FeatureVectorModel:
    """Any regressor behind `predict` alone, so the scorer takes the feature-vector path."""

    model: Regressor

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self.model.predict(features)


@dataclass(frozen=True)
class Case:
    name: str
    split: TadScorer
    feature_vector: TadScorer
    aggregation: Aggregation


def case_of(name: str, weights: np.ndarray, bias: float, spec: FeatureSpec, aggregation: Aggregation) -> Case:
    return Case(
        name=name,
        split=TadScorer(Linear(weights, bias), spec, 1e-4),
        feature_vector=TadScorer(FeatureVectorModel(Linear(weights, bias)), spec, 1e-4),
        aggregation=aggregation,
    )


def default_case() -> Case:
    """The committed artifact's own regressor and spec."""
    trained = load_artifact(DEFAULT_ARTIFACT).trained()
    spec, regressor = trained.spec, trained.tad.regressor
    name = f"default artifact ({spec.num_layers} layers x {spec.num_heads} heads, {trained.regressor.kind})"
    if isinstance(regressor, Ridge):
        weights = np.asarray(regressor.coef_, dtype=np.float64)
        return case_of(name, weights, float(regressor.intercept_), spec, trained.aggregation)
    if trained.tad.split is None:
        raise SystemExit(f"{DEFAULT_ARTIFACT}: the scorer has no split weights for this stage 2")
    generic = TadScorer(FeatureVectorModel(regressor), spec, trained.epsilon)
    return Case(name, trained.tad, generic, trained.aggregation)


def random_case(name: str, layers: int, heads: int, n_lags: int, stage2: str = "ridge") -> Case:
    spec = FeatureSpec(n_lags=n_lags, num_layers=layers, num_heads=heads, convention=Convention.GENERATING)
    rng = np.random.default_rng(0)
    if stage2 == "ridge":
        return case_of(name, rng.normal(0.0, 1e-3, spec.stage2_size), 0.5, spec, Aggregation.MEAN)
    mlp = random_mlp(spec.stage2_size, 256, rng)
    split = TadScorer(mlp, spec, 1e-4)
    return Case(f"{name}, MLP 256 x 256", split, TadScorer(FeatureVectorModel(mlp), spec, 1e-4), Aggregation.MEAN)


def random_mlp(inputs: int, width: int, rng: np.random.Generator) -> MLPRegressor:
    """A fitted-looking scikit-learn MLP of two ReLU layers (float32 weights, as fit leaves them)."""
    model = MLPRegressor(hidden_layer_sizes=(width, width))
    shapes = [(inputs, width), (width, width), (width, 1)]
    model.coefs_ = [rng.normal(0.0, 1.0 / np.sqrt(rows), (rows, cols)).astype(np.float32) for rows, cols in shapes]
    model.intercepts_ = [np.zeros(width, np.float32), np.zeros(width, np.float32), np.array([0.5], np.float32)]
    model.n_layers_, model.n_outputs_, model.out_activation_, model.n_features_in_ = 4, 1, "identity", inputs
    return model


def answer_inputs(spec: FeatureSpec, tokens: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Log-probabilities and step rows shaped as the capture records them (each row sums to < 1)."""
    rng = np.random.default_rng(seed)
    logprobs = np.log(rng.uniform(0.05, 1.0, tokens))
    rows = rng.dirichlet(np.ones(spec.n_lags + 4), size=(tokens, spec.num_layers, spec.num_heads))
    return logprobs, rows[..., : spec.n_lags + 1].astype(np.float32)


def per_token_us(run: Callable[[], object], tokens: int) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) / tokens * 1e6


def measure(case: Case, tokens: int, repeats: int) -> dict[str, float]:
    logprobs, rows = answer_inputs(case.split.spec, tokens, seed=1)
    split = case.split.confidences(logprobs, rows)
    reference = case.feature_vector.confidences(logprobs, rows)
    worst = float(np.max(np.abs(split - reference)))
    runs: dict[str, Callable[[], object]] = {
        "feature vector": lambda: case.feature_vector.confidences(logprobs, rows),
        "split weights": lambda: case.split.confidences(logprobs, rows),
    }
    stats = {"logprob": logprobs, "entropy": -logprobs}
    trace = TokenTrace(token_ids=tuple(range(tokens)), stats=stats, attention=rows)

    def whole_answer() -> object:  # what `AnswerScorer.score` runs when an answer ends
        confidences = case.split.confidences_of(trace)
        return score_all(MethodInput(trace, confidences, case.aggregation), tad_available=True)

    def streamed() -> object:  # `AnswerProgress.on_step` for a streamed answer: one token per step
        stream = case.split.stream()
        for step in range(1, tokens + 1):
            stream.advance(logprob_list[:step], row_list[:step])
        return stream.confidences

    logprob_list, row_list = list(logprobs), list(rows)
    runs["whole answer"] = whole_answer
    runs["streamed"] = streamed
    times: dict[str, list[float]] = {name: [] for name in runs}
    for repeat in range(repeats):
        names = list(runs)
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:  # rotating order
            times[name].append(per_token_us(runs[name], tokens))
    result = {name: statistics.median(values) for name, values in times.items()}
    result["max |difference|"] = worst
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=128, help="answer length")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--n-lags", type=int, default=10, help="N for the larger shapes")
    parser.add_argument("--stage2", choices=("ridge", "mlp"), default="ridge", help="the larger shapes' stage 2")
    args = parser.parse_args()

    cases = [default_case()] + [
        random_case(name, layers, heads, args.n_lags, args.stage2) for name, layers, heads in LARGER_SHAPES
    ]
    print(f"{args.tokens}-token answers, {args.repeats} interleaved repeats, medians (microseconds per token)\n")
    print(
        "| regressor | features | feature vector | split weights | speed-up | whole answer (TAD + baselines) "
        "| streamed | max abs difference |"
    )
    print("|---|---|---|---|---|---|---|---|")
    speedups = []
    for case in cases:
        result = measure(case, args.tokens, args.repeats)
        speedup = result["feature vector"] / result["split weights"]
        speedups.append(speedup)
        print(
            f"| {case.name} | {case.split.spec.stage2_size:,} | {result['feature vector']:.1f} | "
            f"{result['split weights']:.1f} | {speedup:.2f}x | {result['whole answer']:.1f} | "
            f"{result['streamed']:.1f} | {result['max |difference|']:.1e} |"
        )
    print(f"\nscoring_speedup={min(speedups):.2f}")


if __name__ == "__main__":
    main()
