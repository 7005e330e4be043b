"""The feature layout of docs/method.md §3, checked element by element on a small example, in both conventions."""

from __future__ import annotations

import numpy as np
import pytest

from app.uncertainty.features import (
    Convention,
    FeatureSpec,
    stage1_features,
    stage2_feature_row,
    stage2_features,
    token_probabilities,
)

SPEC = FeatureSpec(n_lags=2, num_layers=2, num_heads=3)
GENERATING = FeatureSpec(n_lags=2, num_layers=2, num_heads=3, convention=Convention.GENERATING)


def _example(n: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs = token_probabilities(np.log(rng.uniform(0.05, 1.0, n)))
    confidences = rng.uniform(0.0, 1.0, n)
    # Step rows: slot k = the key k positions back from the step's query (slot 0: the query itself).
    attention = rng.uniform(0.0, 1.0, (n, SPEC.num_layers, SPEC.num_heads, SPEC.n_lags + 1)).astype(np.float32)
    return probs, confidences, attention


def test_sizes_match_method_md() -> None:
    assert FeatureSpec(10, 30, 9).stage2_size == 2721  # SmolLM2-135M
    assert FeatureSpec(10, 32, 32).stage2_size == 10261  # Llama-3.1-8B
    assert SPEC.stage1_size == 3


def test_stage2_vector_layout_and_zero_padding() -> None:
    probs, conf, attention = _example()
    features = stage2_features(probs, conf, attention, SPEC)
    assert features.shape == (3, SPEC.stage2_size) and features.dtype == np.float32
    block = SPEC.lag_block  # 2 + 2 * 3
    # Token i = 3 (1-based), row 1: lag 1 -> token 2, lag 2 -> token 1; consuming: the step of token 3.
    row = features[1]
    assert row[0] == probs[1] and row[1] == np.float32(conf[1])
    assert np.array_equal(row[2:block], attention[2, :, :, 1].reshape(-1))  # layer-major, head-minor
    assert row[block] == probs[0] and row[block + 1] == np.float32(conf[0])
    assert np.array_equal(row[block + 2 : 2 * block], attention[2, :, :, 2].reshape(-1))
    assert row[-1] == probs[2]
    # Token i = 2, row 0: lag 2 would be token 0, which does not exist: zeros, never the prompt.
    assert np.all(features[0, block : 2 * block] == 0)
    assert features[0, 0] == probs[0] and features[0, -1] == probs[1]


def test_generating_convention_reads_the_step_that_produced_the_token() -> None:
    probs, conf, attention = _example()
    features = stage2_features(probs, conf, attention[:-1], GENERATING)  # the last step row is never needed
    block = GENERATING.lag_block
    # Token 3 (1-based) was produced by the step consuming token 2 (row 1): lag 1 is that query itself.
    assert np.array_equal(features[1, 2:block], attention[1, :, :, 0].reshape(-1))
    assert np.array_equal(features[1, block + 2 : 2 * block], attention[1, :, :, 1].reshape(-1))
    assert features[1, 0] == probs[1] and features[1, -1] == probs[2]


def test_stage1_vector_layout() -> None:
    probs, _, _ = _example(5)
    features = stage1_features(probs, 3)
    assert features.shape == (4, 4)
    np.testing.assert_array_equal(features[3], [probs[3], probs[2], probs[1], probs[4]])
    np.testing.assert_array_equal(features[0], [probs[0], 0, 0, probs[1]])


@pytest.mark.parametrize("spec", [SPEC, GENERATING], ids=["consuming", "generating"])
@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_row_builder_is_bit_identical_to_matrix_builder(n: int, spec: FeatureSpec) -> None:
    probs, conf, attention = _example(n, seed=n)
    matrix = stage2_features(probs, conf, attention, spec)
    rows = [stage2_feature_row(i, probs, conf, attention, spec) for i in range(1, n)]
    assert len(rows) == len(matrix)
    for row, expected in zip(rows, matrix, strict=True):
        assert row.tobytes() == expected.tobytes()


def test_attention_shape_is_checked() -> None:
    probs, conf, attention = _example()
    with pytest.raises(ValueError, match="shape"):
        stage2_features(probs, conf, attention[:, :1], SPEC)
