"""The two training stages of TAD (docs/method.md §6, Algorithm 1) on stored traces.

Stage 2 regresses the text's target on, for each lag, the earlier token's probability,
confidence c and attention row; where c comes from is what the variants differ in:

- algorithm1-literal: Algorithm 1 read literally. Stage 1 regresses the target on
  probability-only vectors; stage 2 gets its in-sample predictions and c_1 = t_k (the
  target itself), which inference never has.
- leak-free: the same stage 1, but out-of-fold predictions and c_1 = p_1 (as at inference).
- authors: the authors' code (LM-Polygraph). Stage 1 is fitted on the full stage-2 vector
  with every earlier c teacher-forced to t_k; stage 2 gets c from out-of-fold stage-1
  models applied recurrently with c_1 = p_1, exactly as the server scores.

Each stage has its own ridge alpha.

Stage-2 vectors are split into a static part (probabilities and attention, which never
change) and the confidence columns (which change with the stage-1 model), so the large
static Gram matrix is accumulated once and only thin cross terms are recomputed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from app.uncertainty.features import FeatureSpec, stage1_features, stage2_features, token_probabilities
from app.uncertainty.tad import Regressor
from app.uncertainty.trace import TokenTrace
from training.ridge import GramStats
from training.runs import TextTrace

CHUNK_ROWS = 4096  # rows per Gram update: large enough for BLAS, small enough for memory


class Variant(StrEnum):
    LEAK_FREE = "leak-free"
    ALGORITHM1_LITERAL = "algorithm1-literal"
    AUTHORS = "authors"


@dataclass
class FitText:
    """One training text: its probabilities, target and (memory-mapped) attention rows."""

    key: str
    dataset: str
    target: float  # the answer's quality, what every PRR is measured against
    stats: dict[str, np.ndarray]
    probs: np.ndarray
    attention: np.ndarray  # step rows [n, layers, heads, lags + 1], possibly a memory map
    group: str = ""  # dataset/prompt style (training/groups.py)
    offset: float = 0.0  # subtracted from the target the regressors learn (within-group centring)
    row_weight: float = 1.0  # weight of each of its rows in both stages' least squares (training/weighting.py)

    @classmethod
    def from_trace(cls, trace: TextTrace, n_lags: int) -> FitText:
        return cls(
            key=trace.key,
            dataset=trace.dataset,
            target=trace.target,
            group=trace.group,
            stats={name: np.asarray(values) for name, values in trace.stats.items()},
            probs=token_probabilities(trace.logprobs),
            attention=trace.rows[..., : n_lags + 1],
        )

    def __len__(self) -> int:
        return len(self.probs)

    @property
    def logprobs(self) -> np.ndarray:
        return self.stats["logprob"]

    def token_trace(self) -> TokenTrace:
        return TokenTrace(token_ids=tuple(range(len(self))), stats=self.stats, attention=np.asarray(self.attention))

    @property
    def training_target(self) -> float:
        """What the regressors learn for this text: the target, less its group's offset when centred."""
        return self.target - self.offset

    def rows_target(self) -> np.ndarray:
        return np.full(max(len(self) - 1, 0), self.training_target)

    def rows_weight(self) -> np.ndarray | None:
        """Per-row weights, or None when every row weighs 1 (the unweighted, faster Gram update)."""
        return None if self.row_weight == 1.0 else np.full(max(len(self) - 1, 0), self.row_weight)


def _chunk_weights(chunk: Sequence[FitText]) -> np.ndarray | None:
    if all(t.row_weight == 1.0 for t in chunk):
        return None
    return np.concatenate([np.full(max(len(t) - 1, 0), t.row_weight) for t in chunk])


def stage1_stats(texts: Iterable[FitText], spec: FeatureSpec) -> GramStats:
    stats = GramStats.zeros(spec.stage1_size)
    for text in texts:
        stats.add(stage1_features(text.probs, spec.n_lags), text.rows_target(), text.rows_weight())
    return stats


def stage1_confidences(
    text: FitText, model: Regressor, variant: Variant, spec: FeatureSpec, epsilon: float
) -> np.ndarray:
    """c_1..c_n from a probability-only stage 1 (algorithm1-literal, leak-free; see the module docstring)."""
    confidences = np.empty(len(text))
    if len(text) == 0:
        return confidences
    confidences[0] = text.training_target if variant is Variant.ALGORITHM1_LITERAL else float(text.probs[0])
    if len(text) > 1:
        features = stage1_features(text.probs, spec.n_lags)
        predicted = np.asarray(model.predict(features), dtype=np.float64)
        confidences[1:] = np.clip(predicted, epsilon, 1.0)
    return confidences


def confidence_lags(confidences: np.ndarray, n_lags: int) -> np.ndarray:
    """The confidence columns `[n - 1, N]` of stage-2 vectors: c_{i-l} for l = 1..N, zero-padded."""
    n = len(confidences)
    lags = np.zeros((max(n - 1, 0), n_lags))
    for lag in range(1, n_lags + 1):
        rows = np.arange(lag - 1, n - 1)
        lags[rows, lag - 1] = confidences[rows + 1 - lag]
    return lags.astype(np.float32)


def static_features(text: FitText, spec: FeatureSpec) -> np.ndarray:
    """Stage-2 vectors with the confidence columns left at zero."""
    return stage2_features(text.probs, np.zeros(len(text)), np.asarray(text.attention), spec)


def _chunks(texts: Sequence[FitText]) -> Iterable[list[FitText]]:
    chunk: list[FitText] = []
    rows = 0
    for text in texts:
        chunk.append(text)
        rows += max(len(text) - 1, 0)
        if rows >= CHUNK_ROWS:
            yield chunk
            chunk, rows = [], 0
    if chunk:
        yield chunk


def static_stats(texts: Sequence[FitText], spec: FeatureSpec) -> GramStats:
    """Gram statistics of the static stage-2 part of these texts."""
    stats = GramStats.zeros(spec.stage2_size)
    for chunk in _chunks(texts):
        stats.add(
            np.concatenate([static_features(t, spec) for t in chunk]),
            np.concatenate([t.rows_target() for t in chunk]),
            _chunk_weights(chunk),
        )
    return stats


def teacher_forced_stats(texts: Sequence[FitText], static: GramStats, spec: FeatureSpec) -> GramStats:
    """The authors' stage 1: full stage-2 vectors with every earlier confidence set to the text's target.

    `static` is these texts' static Gram: only the thin confidence terms are computed here.
    """
    forced = [[np.full(len(text), text.training_target) for text in texts]]
    return stage2_stats(static, cross_stats(texts, forced, spec), 0, spec)


@dataclass
class CrossStats:
    """Confidence-column terms of the stage-2 Gram for several candidate stage-1 models at once."""

    static_x_conf: np.ndarray  # [F, K * N]
    conf_x_conf: np.ndarray  # [K, N, N]
    conf_x_y: np.ndarray  # [K, N]
    conf_sum: np.ndarray  # [K, N]


def cross_stats(texts: Sequence[FitText], confidences: Sequence[Sequence[np.ndarray]], spec: FeatureSpec) -> CrossStats:
    """`confidences[k][j]` are candidate k's c values for `texts[j]`."""
    n_candidates, n_lags = len(confidences), spec.n_lags
    result = CrossStats(
        static_x_conf=np.zeros((spec.stage2_size, n_candidates * n_lags)),
        conf_x_conf=np.zeros((n_candidates, n_lags, n_lags)),
        conf_x_y=np.zeros((n_candidates, n_lags)),
        conf_sum=np.zeros((n_candidates, n_lags)),
    )
    position = 0
    for chunk in _chunks(texts):
        static = np.concatenate([static_features(t, spec) for t in chunk]).astype(np.float64)
        targets = np.concatenate([t.rows_target() for t in chunk])
        weights = _chunk_weights(chunk)
        if weights is not None:
            static *= weights[:, None]  # only ever multiplied by the unweighted confidence columns below
        columns = []
        for k in range(n_candidates):
            lags = np.concatenate(
                [confidence_lags(confidences[k][position + j], n_lags) for j in range(len(chunk))]
            ).astype(np.float64)
            columns.append(lags)
            weighted = lags if weights is None else lags * weights[:, None]
            result.conf_x_conf[k] += weighted.T @ lags
            result.conf_x_y[k] += weighted.T @ targets
            result.conf_sum[k] += weighted.sum(axis=0)
        result.static_x_conf += static.T @ np.concatenate(columns, axis=1)
        position += len(chunk)
    return result


def stage2_stats(static: GramStats, cross: CrossStats, candidate: int, spec: FeatureSpec) -> GramStats:
    """Full stage-2 statistics: the static Gram with candidate k's confidence columns filled in."""
    n_lags = spec.n_lags
    columns = spec.confidence_columns()
    block = cross.static_x_conf[:, candidate * n_lags : (candidate + 1) * n_lags]  # [F, N]
    xtx = static.xtx.copy()
    xtx[:, columns] += block
    xtx[columns, :] += block.T
    xtx[np.ix_(columns, columns)] += cross.conf_x_conf[candidate]
    xty = static.xty.copy()
    xty[columns] += cross.conf_x_y[candidate]
    sum_x = static.sum_x.copy()
    sum_x[columns] += cross.conf_sum[candidate]
    return GramStats(xtx=xtx, xty=xty, sum_x=sum_x, sum_y=static.sum_y, count=static.count)


def stage2_matrix(
    texts: Sequence[FitText], confidences: Sequence[np.ndarray], spec: FeatureSpec
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The full stage-2 design matrix, targets and row weights (None: all 1) in memory (for the optional MLP)."""
    features = [
        stage2_features(t.probs, c, np.asarray(t.attention), spec) for t, c in zip(texts, confidences, strict=True)
    ]
    targets = [t.rows_target() for t in texts]
    return np.concatenate(features), np.concatenate(targets), _chunk_weights(texts)
