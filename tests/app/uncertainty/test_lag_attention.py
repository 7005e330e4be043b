"""FeatureSpec.lag_attention: what the playground shows of a token's attention is what stage 2 reads."""

from __future__ import annotations

import numpy as np
import pytest

from app.uncertainty.features import Convention, FeatureSpec, stage2_features, token_probabilities


@pytest.mark.parametrize("convention", list(Convention))
def test_lag_attention_is_the_mean_of_the_stage2_attention_block(convention: Convention) -> None:
    spec = FeatureSpec(n_lags=3, num_layers=2, num_heads=3, convention=convention)
    rng = np.random.default_rng(0)
    n = 6
    probs = token_probabilities(np.log(rng.uniform(0.05, 1.0, n)))
    confidences = rng.uniform(0.0, 1.0, n)
    rows = rng.uniform(0.0, 1.0, (n, spec.num_layers, spec.num_heads, spec.n_lags + 1)).astype(np.float32)
    features = stage2_features(probs, confidences, rows[: spec.rows_needed(n)], spec)
    for index in range(1, n):
        lags = spec.lag_attention(rows, index)
        assert lags is not None and len(lags) == spec.n_lags
        for lag in range(1, spec.n_lags + 1):
            offset = (lag - 1) * spec.lag_block + 2
            block = features[index - 1, offset : offset + spec.attention_size]
            if lag > index:  # reaches before the answer: the features hold zeros, the display shows nothing
                assert lags[lag - 1] is None and not block.any()
            else:
                assert lags[lag - 1] == pytest.approx(float(block.astype(np.float64).mean()), abs=1e-6)


def test_the_first_token_has_no_attention_to_show() -> None:
    rows = np.ones((2, 1, 1, 3), dtype=np.float32)
    consuming = FeatureSpec(n_lags=2, num_layers=1, num_heads=1)
    generating = FeatureSpec(n_lags=2, num_layers=1, num_heads=1, convention=Convention.GENERATING)
    # c_1 = p_1 under both conventions: nothing is read, whether or not a row exists yet
    assert consuming.lag_attention(rows, 0) is None
    assert consuming.lag_attention(rows[:0], 0) is None
    assert generating.lag_attention(rows, 0) is None
    assert consuming.lag_attention(rows[:1], 1) is None  # its row has not arrived yet
