import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor

from training.mlp_inputs import ColumnScaling, fold_into_first_layer


def _columns_of_many_scales(rows: int = 400) -> np.ndarray:
    rng = np.random.default_rng(0)
    features = (rng.random((rows, 12)) * np.logspace(-5, 0, 12)).astype(np.float32)
    features[:, 4] = 0.1  # a constant column (not exact in binary, so a one-pass variance would not be 0)
    features[:, 7] = 123.4
    return features


def test_scaling_is_each_columns_mean_and_deviation_whatever_the_chunking() -> None:
    features = _columns_of_many_scales()
    scaling = ColumnScaling.of(features, chunk_rows=37)
    # Rounded to float32, the precision the standardised matrix is computed in.
    np.testing.assert_allclose(scaling.mean, features.astype(np.float64).mean(axis=0), rtol=1e-7)
    assert np.all(scaling.mean.astype(np.float32).astype(np.float64) == scaling.mean)
    expected = features.astype(np.float64).std(axis=0)
    expected[[4, 7]] = 1.0  # constant columns are only centred
    np.testing.assert_allclose(scaling.scale, expected, rtol=1e-6)
    standardised = scaling.apply(features)
    assert standardised.dtype == np.float32
    np.testing.assert_allclose(standardised.std(axis=0)[[0, 5, 11]], 1.0, rtol=1e-3)
    assert np.all(standardised[:, [4, 7]] == 0.0)


def test_no_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="no rows"):
        ColumnScaling.of(np.zeros((0, 3), dtype=np.float32))


def test_the_folded_network_computes_on_raw_features_what_it_learnt_on_standardised_ones() -> None:
    features = _columns_of_many_scales()
    targets = features @ np.linspace(-1.0, 1.0, 12) * 1e3
    scaling = ColumnScaling.of(features)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        network = MLPRegressor(hidden_layer_sizes=(8, 8), max_iter=20, random_state=0).fit(
            scaling.apply(features), targets
        )
    learnt = network.predict(scaling.apply(features))
    network_weights_of_constants = network.coefs_[0][[4, 7]].copy()
    folded = fold_into_first_layer(network, scaling)
    assert folded.coefs_[0].dtype == np.float32 and folded.intercepts_[0].dtype == np.float32
    np.testing.assert_allclose(folded.predict(features), learnt, rtol=1e-4, atol=1e-4 * np.abs(learnt).max())
    # Constant columns are not divided by rounding noise: their folded weights stay the fitted ones.
    np.testing.assert_array_equal(folded.coefs_[0][[4, 7]], network_weights_of_constants)
