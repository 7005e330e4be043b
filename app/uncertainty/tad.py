"""The recurrent TAD scorer: token confidences c_i from the trained stage-2 regressor.

c_1 = p_1; for i >= 2, c_i = clip(C2(z_i), eps, 1), where z_i holds the confidences of
the N tokens before i. Streaming and whole-sequence scoring run the same code over the tokens
that can be scored together, so a streamed answer gets the confidences of the same answer
scored at once up to float rounding (matrix products over different blocks of tokens sum in
different orders).

C2 is applied without building z_i: its weights are split by what they multiply
(`LinearStage2` for a ridge; `MLPStage2` runs its first layer that way, with a weight matrix in
place of the vector, and skips scikit-learn's per-call input checks). Everything that needs no
confidence (the step rows' attention terms, the earlier p's, p_i) is one matrix product over
all the tokens scored together; only the earlier c's, the recurrence, run token by token, in
plain Python for a ridge. Building the 2,700-10,000-value vector per token and casting it was
most of the scorer's time; one numpy call per token after that.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np

from app.uncertainty.features import FEATURE_DTYPE, FeatureSpec, stage2_feature_row, token_probabilities
from app.uncertainty.trace import TokenTrace


class Regressor(Protocol):
    def predict(self, features: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class AveragedRegressor:
    """A stage 2 that predicts the mean of its members' predictions, all fitted on the same features.

    The SmolLM2 artifact's: its ridge and its MLP (docs/experiments/ridge-mlp-average.md), whose
    cross-validated errors differ enough that their mean ranks answers better than either.
    """

    members: tuple[Regressor, ...]

    @property
    def n_features_in_(self) -> int | None:
        """The members' common input size, as scikit-learn names it (artifact loading checks it)."""
        sizes = {getattr(member, "n_features_in_", None) for member in self.members}
        if len(sizes) != 1:
            raise ValueError(f"the averaged regressors take different numbers of features: {sorted(map(str, sizes))}")
        return sizes.pop()

    def predict(self, features: np.ndarray) -> np.ndarray:
        predictions = [np.asarray(m.predict(features), dtype=np.float64).reshape(-1) for m in self.members]
        return np.mean(predictions, axis=0)


def predict_one(regressor: Regressor, row: np.ndarray) -> float:
    """One prediction; linear models skip scikit-learn's per-call input validation."""
    coef = getattr(regressor, "coef_", None)
    intercept = getattr(regressor, "intercept_", None)
    if coef is not None and intercept is not None and np.ndim(coef) == 1:
        return float(np.dot(row.astype(np.float64), coef) + intercept)
    return float(np.asarray(regressor.predict(row[None, :]), dtype=np.float64).reshape(-1)[0])


@dataclass(frozen=True)
class LinearStage2:
    """A linear stage-2 regressor's weights, arranged as its inputs arrive (docs/method.md §4).

    `attention[k - 1]` weighs a token's whole step row as captured (`[layers, heads, N + 1]`
    flattened, float64) with every lag beyond k zeroed: token i (0-based) uses k = min(i, N),
    which is what the zeros of its feature vector do. Inputs are rounded to float32 first, as
    the feature vector holds them, so this computes C2(z_i) up to the order of the sums.
    """

    intercept: float | np.ndarray  # [H] for a layer of H outputs
    probability: np.ndarray  # [N] (or [N, H]) weights of p_{i-l}, l = 1..N
    confidence: np.ndarray  # [N] (or [N, H]) weights of c_{i-l}
    current: float | np.ndarray  # weight of p_i
    attention: tuple[np.ndarray, ...]
    slots_read: int  # slots a row must have: N (generating) or N + 1 (consuming)

    @classmethod
    def of(cls, regressor: Regressor, spec: FeatureSpec) -> LinearStage2 | None:
        """The split weights, or None when the regressor is not a plain linear model of this spec's size."""
        coef = getattr(regressor, "coef_", None)
        intercept = getattr(regressor, "intercept_", None)
        if coef is None or intercept is None or np.ndim(coef) != 1 or np.ndim(intercept) != 0:
            return None
        if len(coef) != spec.stage2_size:
            return None
        return cls.split(np.asarray(coef, dtype=np.float64), float(intercept), spec)

    @classmethod
    def split(cls, weights: np.ndarray, intercept: float | np.ndarray, spec: FeatureSpec) -> LinearStage2:
        """`weights` `[stage2_size]`, or `[stage2_size, H]` for a layer of H outputs, split by input."""
        outputs = weights.shape[1:]
        n_lags = spec.n_lags
        blocks = weights[: n_lags * spec.lag_block].reshape(n_lags, spec.lag_block, *outputs)
        # The slots the capture records, each output's weights last.
        by_slot = np.zeros((spec.num_layers, spec.num_heads, n_lags + 1, *outputs))
        for lag in range(1, n_lags + 1):
            by_slot[:, :, lag - 1 + spec.slot_shift] = blocks[lag - 1, 2:].reshape(
                spec.num_layers, spec.num_heads, *outputs
            )
        attention = []
        for known in range(1, n_lags + 1):
            masked = by_slot.copy()
            masked[:, :, known + spec.slot_shift :] = 0.0
            attention.append(masked.reshape(-1, *outputs))
        base = n_lags * spec.lag_block
        return cls(
            intercept=intercept,
            probability=blocks[:, 0].copy(),
            confidence=blocks[:, 1].copy(),
            current=weights[base].copy() if outputs else float(weights[base]),
            attention=tuple(attention),
            slots_read=n_lags + spec.slot_shift,
        )

    def attention_terms(self, rows: Sequence[np.ndarray], indices: range, row_shift: int) -> np.ndarray:
        """The attention terms `[len(indices), *outputs]` of tokens `indices` (each >= 1)."""
        return self._attention_terms([(rows, indices)], row_shift)

    def attention_terms_of(
        self, answers: Sequence[tuple[Sequence[np.ndarray], range]], row_shift: int
    ) -> list[np.ndarray]:
        """`attention_terms` of several answers' (step rows, token indices) in one matrix product."""
        terms = self._attention_terms(answers, row_shift)
        return np.split(terms, np.cumsum([len(indices) for _, indices in answers])[:-1])

    def _attention_terms(self, answers: Sequence[tuple[Sequence[np.ndarray], range]], row_shift: int) -> np.ndarray:
        """The answers' tokens' attention terms, stacked. A token with fewer than N earlier tokens has the
        slots of lags it lacks zeroed in its row, which is what the masked weights (`attention`) do."""
        n_lags = len(self.probability)
        slot_shift = self.slots_read - n_lags
        slots = min(rows[index - row_shift].shape[-1] for rows, indices in answers for index in indices)
        used, weights = self._attention_weights(slots, n_lags)
        block = np.stack(
            [rows[index - row_shift][..., :used] for rows, indices in answers for index in indices], dtype=np.float64
        )
        tokens = [index for _, indices in answers for index in indices]
        for position, index in enumerate(tokens):
            if index < n_lags:
                block[position, :, :, index + slot_shift :] = 0.0
        return block.reshape(len(tokens), -1) @ weights

    def _attention_weights(self, slots: int, lags: int) -> tuple[int, np.ndarray]:
        """How many of a row's `slots` the weights read, and the weights of a token with `lags` earlier tokens
        for rows cut to that many slots, flattened (rows captured with more lags than N are cut)."""
        if slots < self.slots_read:
            raise ValueError(f"attention rows hold {slots} slots; {len(self.probability)} lags need more")
        recorded = len(self.probability) + 1
        used, weights = min(slots, recorded), self.attention[lags - 1]
        if used == recorded:
            return used, weights
        outputs = weights.shape[1:]
        return used, weights.reshape(-1, recorded, *outputs)[:, :used].reshape(-1, *outputs)

    def fixed_terms(self, indices: range, probs: Sequence[np.float32], attention_terms: np.ndarray) -> np.ndarray:
        """Every term of tokens `indices` (each >= 1, ascending by one) but the earlier confidences': the
        intercept, the attention term, the earlier p's and p_i. `[len(indices), *outputs]`."""
        n_lags = len(self.probability)
        start, stop = indices.start, indices.stop
        low = max(start - n_lags, 0)
        known = np.asarray(probs[low:stop], dtype=FEATURE_DTYPE).astype(np.float64)
        # padded[t] = p_{start - N + t}, zero before the first token: the feature vector's zeros.
        padded = np.concatenate([np.zeros(n_lags - (start - low)), known])
        # Row j: p_{i-1}, ..., p_{i-N} of token i = start + j.
        earlier = padded[np.arange(len(indices))[:, None] + np.arange(n_lags - 1, -1, -1)[None, :]]
        current = padded[n_lags:]
        return self.intercept + attention_terms + earlier @ self.probability + np.multiply.outer(current, self.current)

    def fixed_term(self, index: int, probs: Sequence[np.float32], row: np.ndarray) -> np.ndarray:
        """`fixed_terms` of the one token `index` from its step row, with a dot product per input: the one
        token a streamed step scores is cheaper so than through the blocks. `[1, *outputs]`."""
        lags = min(len(self.probability), index)
        earlier = np.asarray(probs[index - lags : index][::-1], dtype=FEATURE_DTYPE).astype(np.float64)
        term = (
            self.intercept
            + self._attention_term(row, lags)
            + earlier @ self.probability[:lags]
            + float(FEATURE_DTYPE(probs[index])) * self.current
        )
        return np.asarray(term)[None]

    def _attention_term(self, row: np.ndarray, lags: int) -> float | np.ndarray:
        used, weights = self._attention_weights(row.shape[-1], lags)
        values = row if used == row.shape[-1] else row[..., :used]  # as captured: no copy but the float64 cast
        return values.astype(np.float64).reshape(-1) @ weights

    def predictions(self, indices: range, fixed: np.ndarray, rounded: Sequence[float]) -> Iterator[float]:
        """C2 of tokens `indices`, each from its `fixed_terms` row and the earlier confidences' terms: the
        recurrence. `rounded` holds the confidences so far as float32 holds them and must receive each
        token's (clipped) confidence before the next prediction is drawn. Plain floats: a numpy call per
        token cost more than the sum of ten products."""
        weights = self._reversed_confidence_weights
        n_lags = len(weights)
        for value, index in zip(fixed.tolist(), indices, strict=True):
            lags = min(index, n_lags)
            yield value + sum(map(operator.mul, rounded[index - lags : index], weights[n_lags - lags :]))

    @cached_property
    def _reversed_confidence_weights(self) -> list[float]:
        """A ridge's weights of c_{i-N}, ..., c_{i-1}, as floats."""
        return [float(weight) for weight in self.confidence[::-1]]


@dataclass(frozen=True)
class MLPStage2:
    """A scikit-learn `MLPRegressor` stage 2 (ReLU hidden layers, one linear output) as plain numpy.

    The first layer is split by input like `LinearStage2`. Its attention term, the bulk of the
    work (a 2,970 x 256 product per token for the default model), needs no confidence, so the
    tokens that arrive together get theirs in one matrix product (`attention_terms`): about six
    times cheaper per token than one product each. Only the rest runs token by token.
    """

    first: LinearStage2
    layers: tuple[tuple[np.ndarray, np.ndarray], ...]  # (weights, biases) after the first layer
    # Averaged with a linear model (`AveragedRegressor` of a ridge and an MLP): the linear model's
    # weights are the first layer's last output column, so its prediction costs one column more.
    with_linear: bool = False

    @classmethod
    def of(cls, regressor: Regressor, spec: FeatureSpec) -> MLPStage2 | None:
        """The split network, or None when the regressor is not such an MLP of this spec's size
        (alone, or averaged with one linear model)."""
        if isinstance(regressor, AveragedRegressor):
            return cls._averaged(regressor, spec)
        network = _relu_network(regressor, spec)
        if network is None:
            return None
        weights, biases = network
        first = LinearStage2.split(weights[0], biases[0], spec)
        return cls(first=first, layers=tuple(zip(weights[1:], biases[1:], strict=True)))

    @classmethod
    def _averaged(cls, regressor: AveragedRegressor, spec: FeatureSpec) -> MLPStage2 | None:
        """The split of exactly one linear model and one ReLU MLP: the linear model rides as the first
        layer's last output column and `predict` halves the sum of the two outputs (None otherwise: the
        feature-vector path scores any other average)."""
        members = regressor.members
        linear_at = [i for i, member in enumerate(members) if LinearStage2.of(member, spec) is not None]
        if len(members) != 2 or len(linear_at) != 1:
            return None
        linear, network = members[linear_at[0]], _relu_network(members[1 - linear_at[0]], spec)
        if network is None:
            return None
        weights, biases = network
        coef = np.asarray(linear.coef_, dtype=np.float64)  # type: ignore[attr-defined]
        first_weights = np.hstack([weights[0], coef[:, None]])
        first_biases = np.append(biases[0], float(linear.intercept_))  # type: ignore[attr-defined]
        first = LinearStage2.split(first_weights, first_biases, spec)
        return cls(first=first, layers=tuple(zip(weights[1:], biases[1:], strict=True)), with_linear=True)

    def attention_terms(self, rows: Sequence[np.ndarray], indices: range, row_shift: int) -> np.ndarray:
        """The first layer's attention terms `[len(indices), H]` of tokens `indices` (each >= 1)."""
        return self.attention_terms_of([(rows, indices)], row_shift)[0]

    def attention_terms_of(
        self, answers: Sequence[tuple[Sequence[np.ndarray], range]], row_shift: int
    ) -> list[np.ndarray]:
        """The first layer's `LinearStage2.attention_terms_of`."""
        return self.first.attention_terms_of(answers, row_shift)

    def fixed_terms(self, indices: range, probs: Sequence[np.float32], attention_terms: np.ndarray) -> np.ndarray:
        """The first layer's `LinearStage2.fixed_terms`."""
        return self.first.fixed_terms(indices, probs, attention_terms)

    def fixed_term(self, index: int, probs: Sequence[np.float32], row: np.ndarray) -> np.ndarray:
        """The first layer's `LinearStage2.fixed_term`."""
        return self.first.fixed_term(index, probs, row)

    def predictions(self, indices: range, fixed: np.ndarray, rounded: Sequence[float]) -> Iterator[float]:
        """The network's outputs for tokens `indices` from their first layer's `fixed_terms` rows, as
        `LinearStage2.predictions` draws them (`rounded` receives each confidence before the next)."""
        weights = self.first.confidence  # [N, H]
        n_lags = len(weights)
        for position, index in enumerate(indices):
            lags = min(index, n_lags)
            earlier = np.asarray(rounded[index - lags : index][::-1], dtype=np.float64)
            hidden = fixed[position] + earlier @ weights[:lags]
            linear = 0.0
            if self.with_linear:
                hidden, linear = hidden[:-1], float(hidden[-1])
            for layer, biases in self.layers:
                hidden = np.dot(np.maximum(hidden, 0.0), layer) + biases
            yield (float(hidden[0]) + linear) / 2 if self.with_linear else float(hidden[0])


def _relu_network(regressor: Regressor, spec: FeatureSpec) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """A scikit-learn MLP's (weights, biases) per layer in float64, or None when it is not a ReLU network
    of one output over this spec's stage-2 features."""
    coefs = getattr(regressor, "coefs_", None)
    intercepts = getattr(regressor, "intercepts_", None)
    if coefs is None or intercepts is None or len(coefs) < 2:
        return None
    if getattr(regressor, "activation", None) != "relu" or getattr(regressor, "out_activation_", None) != "identity":
        return None
    if np.shape(coefs[0])[0] != spec.stage2_size or np.shape(coefs[-1])[1] != 1:
        return None
    return [np.asarray(c, dtype=np.float64) for c in coefs], [np.asarray(b, dtype=np.float64) for b in intercepts]


@dataclass
class TadStream:
    """Incremental scoring of one sequence as its tokens and attention rows arrive."""

    tad: TadScorer
    confidences: list[float] = field(default_factory=list, init=False)  # c_i so far (`_rounded` follows it)
    _probs: list[np.float32] = field(default_factory=list, init=False)
    _rounded: list[float] = field(default_factory=list, init=False, repr=False, compare=False)  # as float32 holds them
    # An MLP's attention terms of the tokens the next `advance` scores, computed with other answers'
    # (`prime_streams`); by token index.
    _primed: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)

    def scorable(self, tokens: int, rows: int) -> range:
        """The tokens an `advance` with `tokens` log-probs and `rows` step rows scores that need an attention row."""
        return range(max(len(self.confidences), 1), min(tokens, rows + self.tad.spec.row_shift))

    def advance(
        self,
        logprobs: Sequence[float],
        attention_rows: Sequence[np.ndarray],
    ) -> list[float]:
        """Score every token that can be scored now; return the new confidences.

        Token 1 needs only its probability; token i >= 2 also needs its attention row: under
        the generating convention it exists as soon as the token is sampled, under the
        consuming one a step later. `attention_rows` are step rows (docs/method.md §2).
        """
        if len(logprobs) > len(self._probs):
            self._probs.extend(token_probabilities(logprobs[len(self._probs) :]))
        probs = self._probs
        start = len(self.confidences)
        if start == 0 and probs:
            self._append(float(probs[0]))
        scorable = self.scorable(len(logprobs), len(attention_rows))
        primed, self._primed = self._primed, {}
        split, epsilon = self.tad.split, self.tad.epsilon
        if scorable and split is not None:
            # Every term but the earlier confidences' for all the tokens scorable now, as matrix products;
            # only the recurrence runs token by token.
            row_shift = self.tad.spec.row_shift
            if primed and all(index in primed for index in scorable):
                fixed = split.fixed_terms(scorable, probs, np.stack([primed[index] for index in scorable]))
            elif len(scorable) == 1:  # a streamed step's token
                fixed = split.fixed_term(scorable.start, probs, attention_rows[scorable.start - row_shift])
            else:
                fixed = split.fixed_terms(scorable, probs, split.attention_terms(attention_rows, scorable, row_shift))
            for raw in split.predictions(scorable, fixed, self._rounded):
                self._append(_clipped(raw, epsilon))
        else:
            for index in scorable:
                row = stage2_feature_row(index, probs, self.confidences, attention_rows, self.tad.spec)
                self._append(_clipped(predict_one(self.tad.regressor, row), epsilon))
        return self.confidences[start:]

    def _append(self, confidence: float) -> None:
        self.confidences.append(confidence)
        self._rounded.append(float(FEATURE_DTYPE(confidence)))


def _clipped(raw: float, epsilon: float) -> float:
    """c_i = clip(C2(z_i), eps, 1); a non-finite prediction would poison every later token: no confidence."""
    return min(max(raw, epsilon), 1.0) if math.isfinite(raw) else epsilon


def prime_streams(pending: Sequence[tuple[TadStream, int, Sequence[np.ndarray]]]) -> None:
    """Before several streams advance on one decode step's tokens: (stream, number of log-probs, step rows) each.

    Streams whose stage 2 is an MLP get the attention terms of the tokens they are about to score
    from one matrix product per stage 2 instead of one each: a product per token reads the whole
    first-layer matrix for one row (docs/performance.md, *An MLP stage 2 at this size*). The
    confidences are those `advance` computes alone, up to float rounding.
    """
    groups: dict[int, list[tuple[TadStream, Sequence[np.ndarray], range]]] = {}
    for stream, tokens, rows in pending:
        indices = stream.scorable(tokens, len(rows))
        if isinstance(stream.tad.split, MLPStage2) and indices:
            groups.setdefault(id(stream.tad.split), []).append((stream, rows, indices))
    for group in groups.values():
        if len(group) < 2:  # `advance` computes a lone stream's own
            continue
        split = group[0][0].tad.split
        assert isinstance(split, MLPStage2)
        terms = split.attention_terms_of(
            [(rows, indices) for _, rows, indices in group], group[0][0].tad.spec.row_shift
        )
        for (stream, _, indices), block in zip(group, terms, strict=True):
            stream._primed = dict(zip(indices, block, strict=True))


@dataclass(frozen=True)
class TadScorer:
    regressor: Regressor
    spec: FeatureSpec
    epsilon: float
    # The regressor's weights split by input (None: build each feature vector and call `predict`).
    split: LinearStage2 | MLPStage2 | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        split = LinearStage2.of(self.regressor, self.spec) or MLPStage2.of(self.regressor, self.spec)
        object.__setattr__(self, "split", split)

    def stream(self) -> TadStream:
        return TadStream(tad=self)

    def confidences(self, logprobs: np.ndarray, attention: np.ndarray | None) -> np.ndarray:
        """Confidences of a whole sequence `[n]` (step rows `[>= rows_needed(n), layers, heads, slots]`)."""
        if len(logprobs) == 0:
            return np.zeros(0)
        needed = self.spec.rows_needed(len(logprobs))
        if needed and (attention is None or len(attention) < needed):
            raise ValueError(f"TAD needs {needed} attention rows for {len(logprobs)} tokens")
        stream = self.stream()
        stream.advance(list(logprobs), [] if attention is None else list(attention))
        return np.array(stream.confidences, dtype=np.float64)

    def confidences_of(self, trace: TokenTrace) -> np.ndarray:
        """Confidences of a trace."""
        return self.confidences(trace.logprobs, trace.attention)
