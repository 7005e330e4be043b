"""The recurrent TAD scorer: c_1 = p_1, c_i = clip(C2(z_i), eps, 1) with earlier c's inside z_i."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.neural_network import MLPRegressor

from app.uncertainty.features import Convention, FeatureSpec, stage2_features, token_probabilities
from app.uncertainty.tad import AveragedRegressor, LinearStage2, MLPStage2, TadScorer, prime_streams

SPEC = FeatureSpec(n_lags=2, num_layers=1, num_heads=2)


def _linear(coef: np.ndarray, intercept: float) -> Ridge:
    model = Ridge()
    model.coef_, model.intercept_, model.n_features_in_ = coef, intercept, len(coef)
    return model


def _inputs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logprobs = np.log(rng.uniform(0.1, 1.0, n))
    attention = rng.uniform(0, 0.5, (n, 1, 2, 3)).astype(np.float32)  # step rows: keys 0..2 back
    return logprobs, attention


def test_recurrence_by_hand() -> None:
    # Weights only on c_{i-1} and p_i: c_i = 0.5 c_{i-1} + 0.4 p_i + 0.05.
    coef = np.zeros(SPEC.stage2_size)
    coef[1] = 0.5
    coef[-1] = 0.4
    scorer = TadScorer(_linear(coef, 0.05), SPEC, epsilon=1e-3)
    logprobs, attention = _inputs(5)
    p = token_probabilities(logprobs).astype(np.float64)
    expected = [p[0]]
    for i in range(1, 5):
        expected.append(0.5 * np.float32(expected[-1]) + 0.4 * p[i] + 0.05)
    np.testing.assert_allclose(scorer.confidences(logprobs, attention), expected, rtol=1e-6)


def test_confidences_are_clipped() -> None:
    low = TadScorer(_linear(np.zeros(SPEC.stage2_size), -3.0), SPEC, epsilon=1e-3)
    high = TadScorer(_linear(np.zeros(SPEC.stage2_size), 7.0), SPEC, epsilon=1e-3)
    logprobs, attention = _inputs(4)
    assert np.all(low.confidences(logprobs, attention)[1:] == 1e-3)
    assert np.all(high.confidences(logprobs, attention)[1:] == 1.0)


class _OpaqueRegressor:
    """A regressor the scorer can only call `predict` on: the feature-vector path."""

    def __init__(self, model: Ridge | MLPRegressor | AveragedRegressor) -> None:
        self.model = model

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self.model.predict(features)


@pytest.mark.parametrize(
    ("convention", "slots"),
    [
        (Convention.GENERATING, 3),  # N + 1 slots, as the capture records
        (Convention.GENERATING, 2),  # the generating convention never reads slot N
        (Convention.CONSUMING, 3),
        (Convention.CONSUMING, 5),  # rows captured with more lags than the spec uses
    ],
)
def test_linear_weights_split_equal_the_feature_vector_path(convention: Convention, slots: int) -> None:
    spec = _spec(convention)
    rng = np.random.default_rng(5)
    model = _linear(rng.normal(0, 0.05, spec.stage2_size), 0.5)
    got, expected, fast = _split_and_feature_vector(model, spec, slots, rng)
    assert isinstance(fast.split, LinearStage2)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)


def _spec(convention: Convention) -> FeatureSpec:
    return FeatureSpec(2, 2, 3, convention=convention)


def _split_and_feature_vector(
    model: Ridge | MLPRegressor | AveragedRegressor, spec: FeatureSpec, slots: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, TadScorer]:
    """Confidences of one random 9-token answer with split weights and on the feature vector, and the split scorer."""
    n = 9
    logprobs = np.log(rng.uniform(0.05, 1.0, n))
    attention = rng.uniform(0, 1, (n, spec.num_layers, spec.num_heads, slots)).astype(np.float32)
    fast = TadScorer(model, spec, epsilon=1e-4)
    generic = TadScorer(_OpaqueRegressor(model), spec, epsilon=1e-4)
    assert generic.split is None
    got = fast.confidences(logprobs, attention)
    expected = generic.confidences(logprobs, attention)
    assert np.all((expected[1:] > 1e-4) & (expected[1:] < 1.0))  # no clipping hides a difference
    return got, expected, fast


@pytest.mark.parametrize(("convention", "slots"), [(Convention.GENERATING, 3), (Convention.CONSUMING, 5)])
def test_mlp_split_equals_scikit_learn_on_the_feature_vector(convention: Convention, slots: int) -> None:
    spec = _spec(convention)
    rng = np.random.default_rng(7)
    got, expected, fast = _split_and_feature_vector(_random_mlp(spec, rng), spec, slots, rng)
    assert isinstance(fast.split, MLPStage2) and not fast.split.with_linear
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def _random_mlp(spec: FeatureSpec, rng: np.random.Generator) -> MLPRegressor:
    """An MLP stage 2 of two hidden layers with small random weights around an output of 0.5 (nothing clipped)."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    model = MLPRegressor(hidden_layer_sizes=(16, 8), max_iter=20, random_state=0)
    with warnings.catch_warnings():  # a few epochs on noise: only the weights' shapes matter
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(rng.uniform(0, 1, (200, spec.stage2_size)), rng.uniform(0.3, 0.7, 200))
    model.coefs_ = [rng.normal(0, 0.2, w.shape) for w in model.coefs_]
    model.intercepts_ = [rng.normal(0, 0.1, b.shape) for b in model.intercepts_[:-1]] + [np.array([0.5])]
    return model


@pytest.mark.parametrize(
    ("convention", "slots", "linear_first"), [(Convention.GENERATING, 3, True), (Convention.CONSUMING, 5, False)]
)
def test_ridge_and_mlp_averaged_split_equal_their_mean_on_the_feature_vector(
    convention: Convention, slots: int, linear_first: bool
) -> None:
    spec = _spec(convention)
    rng = np.random.default_rng(11)
    ridge, mlp = _linear(rng.normal(0, 0.05, spec.stage2_size), 0.5), _random_mlp(spec, rng)
    averaged = AveragedRegressor((ridge, mlp) if linear_first else (mlp, ridge))
    rows = rng.uniform(0, 1, (5, spec.stage2_size))
    np.testing.assert_allclose(averaged.predict(rows), (ridge.predict(rows) + mlp.predict(rows)) / 2, rtol=1e-12)
    got, expected, fast = _split_and_feature_vector(averaged, spec, slots, rng)
    assert isinstance(fast.split, MLPStage2) and fast.split.with_linear
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


def test_an_average_the_split_cannot_take_falls_back_to_the_feature_vector_path() -> None:
    rng = np.random.default_rng(12)
    spec = FeatureSpec(n_lags=2, num_layers=1, num_heads=2)
    ridge = _linear(rng.normal(0, 0.05, spec.stage2_size), 0.5)
    mlp = _random_mlp(spec, rng)
    for members in [
        (ridge, ridge),
        (ridge,),
        (ridge, mlp, mlp),  # equal thirds: not a ridge beside one network
        (ridge, AveragedRegressor((ridge, mlp))),
        (mlp, mlp),  # several networks: what `fit --mlp-seeds` (removed since) installed, alone ...
        (ridge, AveragedRegressor((mlp, mlp))),  # ... or beside a ridge
    ]:
        scorer = TadScorer(AveragedRegressor(members), spec, epsilon=1e-4)
        assert scorer.split is None
        logprobs, attention = _inputs(5)
        assert len(scorer.confidences(logprobs, attention)) == 5


def test_an_mlp_of_another_activation_takes_the_feature_vector_path() -> None:
    spec = FeatureSpec(n_lags=2, num_layers=1, num_heads=2, convention=Convention.GENERATING)
    model = MLPRegressor(hidden_layer_sizes=(4,), activation="tanh", max_iter=1)
    with pytest.warns(Warning):
        model.fit(np.ones((4, spec.stage2_size)), np.full(4, 0.5))
    assert TadScorer(model, spec, epsilon=1e-4).split is None


def test_confidences_are_the_regressor_on_the_training_builder_s_features() -> None:
    rng = np.random.default_rng(1)
    model = _linear(rng.normal(0, 0.1, SPEC.stage2_size), 0.5)
    scorer = TadScorer(model, SPEC, epsilon=1e-4)
    logprobs, attention = _inputs(6, seed=2)
    confidences = scorer.confidences(logprobs, attention)
    rebuilt = stage2_features(token_probabilities(logprobs), confidences, attention, SPEC)
    np.testing.assert_allclose(confidences[1:], np.clip(model.predict(rebuilt), 1e-4, 1.0), rtol=1e-12)


def test_rows_with_too_few_slots_are_refused() -> None:
    spec = FeatureSpec(n_lags=2, num_layers=1, num_heads=2, convention=Convention.CONSUMING)
    scorer = TadScorer(_linear(np.ones(spec.stage2_size), 0.0), spec, epsilon=1e-4)
    logprobs, attention = _inputs(4)
    with pytest.raises(ValueError, match="slots"):
        scorer.confidences(logprobs, attention[:, :, :, :2])


@pytest.mark.parametrize("convention", list(Convention))
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # any fitted MLP will do here
def test_streaming_in_arrival_order_equals_whole_sequence(convention: Convention) -> None:
    spec = FeatureSpec(n_lags=2, num_layers=1, num_heads=2, convention=convention)
    rng = np.random.default_rng(3)
    features = rng.uniform(0, 1, (200, spec.stage2_size))
    mlp = MLPRegressor(hidden_layer_sizes=(8,), max_iter=50, random_state=0).fit(features, features[:, -1])
    linear = _linear(rng.normal(0, 0.2, spec.stage2_size), 0.3)
    for regressor in (linear, mlp, AveragedRegressor((linear, mlp))):
        scorer = TadScorer(regressor, spec, epsilon=1e-4)
        logprobs, attention = _inputs(7, seed=4)
        whole = scorer.confidences(logprobs, attention)
        stream = scorer.stream()
        got: list[float] = []
        # A token's step row (from the step consuming it) arrives one step after the token.
        for step in range(1, 8):
            got += stream.advance(list(logprobs[:step]), list(attention[: step - 1]))
            if convention is Convention.GENERATING:
                assert len(got) == step  # each token's confidence is known the moment it is sampled
        got += stream.advance(list(logprobs), list(attention))
        # Attention terms come from one matrix product over the tokens that arrive together, whose
        # summation order can differ in the last bit from a product over the whole answer.
        np.testing.assert_allclose(got, whole, rtol=1e-12, atol=0)
        assert got[0] == float(token_probabilities(logprobs[:1])[0])


@pytest.mark.parametrize("convention", list(Convention))
def test_streams_primed_together_score_as_each_alone(convention: Convention, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = FeatureSpec(n_lags=3, num_layers=2, num_heads=2, convention=convention)
    rng = np.random.default_rng(13)
    averaged = AveragedRegressor((_linear(rng.normal(0, 0.05, spec.stage2_size), 0.5), _random_mlp(spec, rng)))
    mlp_scorer = TadScorer(averaged, spec, 1e-4)
    linear_scorer = TadScorer(_linear(rng.normal(0, 0.05, spec.stage2_size), 0.5), spec, 1e-4)
    # Answers of different lengths starting at different steps, so that one step's product holds
    # tokens both before and after the N-th.
    answers = [_inputs_of(spec, n, seed) for n, seed in ((9, 1), (5, 2), (12, 3))]
    scorers = [mlp_scorer, mlp_scorer, linear_scorer, mlp_scorer]
    inputs = [*answers[:2], answers[0], answers[2]]
    starts = [0, 5, 1, 2]
    alone = [s.confidences(logprobs, rows) for s, (logprobs, rows) in zip(scorers, inputs, strict=True)]
    streams = [s.stream() for s in scorers]
    products: list[list[int]] = []
    original = MLPStage2.attention_terms_of

    def recorded(self: MLPStage2, answers: list, row_shift: int) -> list[np.ndarray]:
        products.append([index for _, indices in answers for index in indices])
        return original(self, answers, row_shift)

    monkeypatch.setattr(MLPStage2, "attention_terms_of", recorded)
    mixed = False
    for step in range(1, 18):
        pending = []
        for stream, (logprobs, rows), start in zip(streams, inputs, starts, strict=True):
            n = max(0, min(step - start, len(logprobs)))
            pending.append((stream, n, list(rows[: max(n - 1, 0)])))  # a step row arrives with the next token
        scoring = [s.scorable(t, len(r)) for s, t, r in pending if s.tad is mlp_scorer and s.scorable(t, len(r))]
        products.clear()
        prime_streams(pending)
        for (stream, tokens, rows), (logprobs, _) in zip(pending, inputs, strict=True):
            stream.advance(list(logprobs[:tokens]), rows)
        # One product for the step's MLP answers (none left for advance), or each its own when only one has work
        # (a lone token: a dot product per input, no block).
        alone_products = [list(r) for r in scoring if len(r) > 1]
        assert products == ([[i for r in scoring for i in r]] if len(scoring) > 1 else alone_products)
        mixed |= len(scoring) > 1 and min(products[0]) < spec.n_lags <= max(products[0])
    assert mixed
    for stream, (logprobs, rows), expected in zip(streams, inputs, alone, strict=True):
        stream.advance(list(logprobs), list(rows))  # the consuming convention's last row
        np.testing.assert_allclose(stream.confidences, expected, rtol=1e-12, atol=0)


def _inputs_of(spec: FeatureSpec, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    logprobs = np.log(rng.uniform(0.1, 1.0, n))
    rows = rng.uniform(0, 0.5, (n, spec.num_layers, spec.num_heads, spec.n_lags + 1)).astype(np.float32)
    return logprobs, rows


@pytest.mark.parametrize(
    ("convention", "slots"),
    [
        (Convention.GENERATING, 3),  # N slots: the generating convention never reads slot N
        (Convention.GENERATING, 4),  # N + 1, as the capture records
        (Convention.CONSUMING, 4),
        (Convention.CONSUMING, 6),  # rows captured with more lags than the spec uses
    ],
)
def test_blocks_of_any_size_score_as_the_feature_vector(convention: Convention, slots: int) -> None:
    """The terms that need no confidence are one product per block of tokens scored together (one dot
    product each for a lone token); blocks that start before, at and after the N-th token give the
    confidences of the regressor applied to each token's feature vector."""
    spec = FeatureSpec(n_lags=3, num_layers=2, num_heads=2, convention=convention)
    rng = np.random.default_rng(17)
    ridge = _linear(rng.normal(0, 0.05, spec.stage2_size), 0.5)
    for regressor in (ridge, _random_mlp(spec, rng), AveragedRegressor((ridge, _random_mlp(spec, rng)))):
        logprobs = np.log(rng.uniform(0.1, 1.0, 14))
        rows = rng.uniform(0, 0.5, (14, spec.num_layers, spec.num_heads, slots)).astype(np.float32)
        expected = TadScorer(_OpaqueRegressor(regressor), spec, epsilon=1e-4).confidences(logprobs, rows)
        assert np.all((expected[1:] > 1e-4) & (expected[1:] < 1.0))  # no clipping hides a difference
        scorer = TadScorer(regressor, spec, epsilon=1e-4)
        assert scorer.split is not None
        np.testing.assert_allclose(scorer.confidences(logprobs, rows), expected, rtol=1e-10, atol=1e-12)
        stream = scorer.stream()
        for arrived in (2, 3, 7, 8, 13, 14):  # blocks of 1, 1, 4, 1, 5 and 1 tokens
            stream.advance(list(logprobs[:arrived]), list(rows[:arrived]))
        assert len(stream.confidences) == 14
        np.testing.assert_allclose(stream.confidences, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("convention", list(Convention))
def test_a_one_token_answer_needs_no_attention_row(convention: Convention) -> None:
    spec = FeatureSpec(n_lags=2, num_layers=1, num_heads=2, convention=convention)
    scorer = TadScorer(_linear(np.full(spec.stage2_size, 0.1), 0.2), spec, epsilon=1e-3)
    logprobs = np.log(np.array([0.5]))
    assert spec.rows_needed(1) == 0 and spec.rows_needed(2) == 2 - spec.row_shift
    assert scorer.confidences(logprobs, None).tolist() == scorer.stream().advance(list(logprobs), []) == [0.5]
