"""The uncertainty methods, as plug-ins: one registry that serving, training, metrics and the API read.

Each method is one `UncertaintyMethod` entry: a name, what it computes, the per-token
statistics it reads (names from `app.engine.token_stats.TOKEN_STATISTICS`) and a function
from one answer to its sequence uncertainty (higher = less trustworthy; NaN when undefined,
e.g. for an empty answer). Adding a method is one entry in `METHODS` and its test: the
`Method` enum, the response schemas, the Prometheus labels, calibration and the training
reports are all built from this registry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from app.uncertainty.aggregation import Aggregation, aggregate
from app.uncertainty.trace import TokenTrace


@dataclass(frozen=True)
class MethodInput:
    """One answer as the methods see it."""

    trace: TokenTrace
    tad_confidences: np.ndarray | None = None  # c_i per token, when the artifact has a TAD regressor
    tad_aggregation: Aggregation | None = None
    p_true: float | None = None  # from the check pass, when one ran (`app/serving/check_pass.py`)


@dataclass(frozen=True)
class UncertaintyMethod:
    name: str
    description: str
    token_stats: tuple[str, ...]
    # NaN when undefined for this answer (e.g. empty); None when unavailable (what it needs is not loaded).
    compute: Callable[[MethodInput], float | None]
    needs_regressor: bool = False
    # Needs a second pass of the model over the question and the answer: computed only when a policy decides
    # with it, never from a trace alone (so not in the training tables, which read traces).
    needs_check_pass: bool = False

    def __call__(self, answer: MethodInput) -> float | None:
        return self.compute(answer)


def maximum_sequence_probability(logprobs: np.ndarray) -> float:
    """MSP uncertainty: -sum_i log p_i."""
    return float(-np.sum(logprobs)) if len(logprobs) else math.nan


def perplexity(logprobs: np.ndarray) -> float:
    """Perplexity uncertainty as docs/method.md §5 defines it: -mean_i log p_i."""
    return float(-np.mean(logprobs)) if len(logprobs) else math.nan


def mean_token_entropy(entropies: np.ndarray) -> float:
    return float(np.mean(entropies)) if len(entropies) else math.nan


def maximum_token_uncertainty(logprobs: np.ndarray) -> float:
    """The least likely token decides: max_i -log p_i."""
    return float(-np.min(logprobs)) if len(logprobs) else math.nan


# RAUQ (Vazhentsev et al., 2025; LM-Polygraph `estimators/rauq.py`): alpha as its default for
# instruction-tuned models; the middle third of the layers.
RAUQ_ALPHA = 0.5
RAUQ_FLOOR = 1e-300  # under log 0 (a token of probability 0 in float64): the score stays finite, and huge


def rauq_layers(num_layers: int) -> range:
    """The middle third of the layers, as the authors select them."""
    return range(num_layers // 3, min(math.ceil(num_layers * 2 / 3) + 1, num_layers))


def rauq(logprobs: np.ndarray, step_rows: np.ndarray | None, alpha: float = RAUQ_ALPHA) -> float:
    """RAUQ from the captured step rows (docs/method.md §5).

    The weight of token j (0-based, j >= 1) is the attention of the step that produced it to
    the previous token, i.e. its query's own position (`step_rows[j - 1][..., 0]`), in each
    layer's head that attends most to the previous token over the answer. Per layer
    `c_1 = p_1`, `c_j = alpha p_j + (1 - alpha) a_j c_{j-1}`, uncertainty `1 - mean_j log c_j`;
    RAUQ is the largest over the middle third of the layers.
    """
    n = len(logprobs)
    if n == 0:
        return math.nan
    probs = np.exp(np.asarray(logprobs, dtype=np.float64))
    if n == 1:  # no attention involved: a one-token answer has no rows when its last step is not captured
        return float(1.0 - np.log(max(probs[0], RAUQ_FLOOR)))
    if step_rows is None or len(step_rows) < n - 1:
        return math.nan
    previous = np.asarray(step_rows[: n - 1, :, :, 0], dtype=np.float64)  # [n - 1, layers, heads]
    layers = np.array(rauq_layers(previous.shape[1]))
    heads = previous[:, layers, :].mean(axis=0).argmax(axis=1)
    carried = (1.0 - alpha) * previous[:, layers, heads]  # [n - 1, len(layers)]
    fresh = (alpha * probs[1:]).tolist()
    confidences = np.empty((n, len(layers)))
    # The recurrence on plain floats, a layer at a time: the same float64 operations as numpy's, without
    # a numpy call per token (the loop was most of the baselines' time on a whole answer).
    for column, weights in enumerate(carried.T.tolist()):
        confidence = float(probs[0])
        values = [confidence]
        for new, weight in zip(fresh, weights, strict=True):
            confidence = new + weight * confidence
            values.append(confidence)
        confidences[:, column] = values
    log_sums = np.log(np.maximum(confidences, RAUQ_FLOOR)).sum(axis=0)
    return float(np.max(1.0 - log_sums / n))


# Attention Score (Sriramanan et al., 2024, "LLM-Check"; LM-Polygraph `estimators/attention_score.py`,
# gen-only): the middle layer, and a floor under log 0 as theirs.
ATTENTION_SCORE_FLOOR = 1e-12


def attention_score(step_rows: np.ndarray | None, n_tokens: int) -> float:
    """Attention Score over the generated tokens (docs/method.md §5).

    In the middle layer (`layers // 2`), the log of each generated token's attention to its own
    position (the diagonal of the attention map), summed over the tokens but the last and
    averaged over heads; uncertainty is its negation (a token that attends less to itself is
    less trusted). The diagonal entry of token j (0-based) is slot 0 of the step that consumes it,
    `step_rows[j]`, which exists for every token but the last under both conventions.
    """
    if n_tokens == 0:
        return math.nan
    if n_tokens == 1:
        return 0.0  # no diagonal entry before the last token: an empty sum, as in the reference
    if step_rows is None or len(step_rows) < n_tokens - 1:
        return math.nan
    layer = step_rows.shape[1] // 2
    diagonal = np.asarray(step_rows[: n_tokens - 1, layer, :, 0], dtype=np.float64)  # [n - 1, heads]
    return float(-np.log(diagonal + ATTENTION_SCORE_FLOOR).sum(axis=0).mean())


def _tad(answer: MethodInput) -> float:
    if answer.tad_confidences is None or answer.tad_aggregation is None:
        return math.nan
    return aggregate(answer.tad_confidences, answer.tad_aggregation)


METHODS: tuple[UncertaintyMethod, ...] = (
    UncertaintyMethod(
        "tad",
        "TAD: 1 - mean c_i, -sum log c_i, -mean log c_i or 1 - min c_i of the learned token confidences "
        "(the artifact says which)",
        ("logprob",),
        _tad,
        needs_regressor=True,
    ),
    UncertaintyMethod(
        "msp",
        "maximum sequence probability: -sum log p_i",
        ("logprob",),
        lambda answer: maximum_sequence_probability(answer.trace.logprobs),
    ),
    UncertaintyMethod(
        "perplexity",
        "-mean log p_i",
        ("logprob",),
        lambda answer: perplexity(answer.trace.logprobs),
    ),
    UncertaintyMethod(
        "mean_token_entropy",
        "mean entropy of the next-token distributions",
        ("entropy",),
        lambda answer: mean_token_entropy(answer.trace.entropies),
    ),
    UncertaintyMethod(
        "max_token_uncertainty",
        "max_i -log p_i: the least likely token",
        ("logprob",),
        lambda answer: maximum_token_uncertainty(answer.trace.logprobs),
    ),
    UncertaintyMethod(
        "rauq",
        "RAUQ: recurrent confidences from token probabilities and previous-token attention, worst middle layer "
        "(needs attention capture)",
        ("logprob",),
        lambda answer: rauq(answer.trace.logprobs, answer.trace.attention),
    ),
    UncertaintyMethod(
        "attention_score",
        "Attention Score: -sum over generated tokens of log self-attention, middle layer, mean over heads "
        "(needs attention capture)",
        (),
        lambda answer: attention_score(answer.trace.attention, len(answer.trace)),
    ),
    UncertaintyMethod(
        "p_true",
        'P(True), the model\'s own check: 1 - the probability it answers "Yes" when shown the question and this '
        "answer and asked whether the answer is correct (one more prompt pass; computed when the policy decides "
        "with it, else null)",
        (),
        lambda answer: answer.p_true,
        needs_check_pass=True,
    ),
)

REGISTRY: Mapping[str, UncertaintyMethod] = {method.name: method for method in METHODS}

# The enum the API, settings and manifests validate method names with, built from the registry.
Method = StrEnum("Method", [(method.name.upper(), method.name) for method in METHODS])  # type: ignore[misc]

# The free methods computed from an answer's trace alone: what training measures and calibrates.
BASELINES: tuple[Method, ...] = tuple(
    Method(m.name) for m in METHODS if not m.needs_regressor and not m.needs_check_pass
)


@dataclass(frozen=True)
class SequenceUncertainty:
    """Every method's sequence uncertainty for one answer; None where a method is unavailable."""

    values: Mapping[Method, float | None]

    def get(self, method: Method) -> float | None:
        return self.values.get(method)

    def as_dict(self) -> dict[str, float | None]:
        return {method.value: value for method, value in self.values.items()}


def score_all(answer: MethodInput, tad_available: bool) -> SequenceUncertainty:
    """Every registered method on one answer (methods that need a TAD regressor are None without one)."""
    values: dict[Method, float | None] = {}
    for method in METHODS:
        if method.needs_regressor and not tad_available:
            values[Method(method.name)] = None
        else:
            values[Method(method.name)] = method(answer)
    return SequenceUncertainty(values)
