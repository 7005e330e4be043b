"""Ridge from streamed sufficient statistics (training/ridge.py) against sklearn's Ridge."""

import numpy as np
import pytest
from sklearn.linear_model import Ridge

from training.ridge import GramStats, fit_ridge, solve_ridge


def _problem(seed=0, rows=300, features=8):
    rng = np.random.default_rng(seed)
    # Non-zero feature means and scales, so the intercept and the centring matter.
    x = rng.normal(loc=rng.uniform(-3, 3, features), scale=rng.uniform(0.5, 2, features), size=(rows, features))
    y = x @ rng.normal(size=features) + 4.0 + rng.normal(scale=0.5, size=rows)
    return x, y


def _stats(x, y, chunks=1):
    stats = GramStats.zeros(x.shape[1])
    for rows in np.array_split(np.arange(len(y)), chunks):
        stats.add(x[rows], y[rows])
    return stats


def _assert_stats_close(a, b):
    np.testing.assert_allclose(a.xtx, b.xtx, rtol=1e-10, atol=1e-8)
    np.testing.assert_allclose(a.xty, b.xty, rtol=1e-10, atol=1e-8)
    np.testing.assert_allclose(a.sum_x, b.sum_x, rtol=1e-10, atol=1e-8)
    assert a.sum_y == pytest.approx(b.sum_y, rel=1e-10, abs=1e-8)
    assert a.count == b.count


@pytest.mark.parametrize("alpha", [1e-3, 1.0, 10.0, 1000.0])
def test_chunked_solution_matches_sklearn_ridge(alpha):
    x, y = _problem()
    reference = Ridge(alpha=alpha).fit(x, y)
    model = fit_ridge(_stats(x, y, chunks=7), alpha)
    np.testing.assert_allclose(model.coef_, reference.coef_, rtol=1e-6)
    assert model.intercept_ == pytest.approx(reference.intercept_, rel=1e-6)
    x_new, _ = _problem(seed=1, rows=50)
    np.testing.assert_allclose(model.predict(x_new), reference.predict(x_new), rtol=1e-6)


def test_solve_ridge_matches_normal_equations_directly():
    # Centred normal equations: (Xc^T Xc + alpha I) w = Xc^T yc, b = mean(y) - mean(x) . w
    x, y = _problem(seed=2, rows=120, features=5)
    alpha = 3.0
    xc, yc = x - x.mean(axis=0), y - y.mean()
    w = np.linalg.solve(xc.T @ xc + alpha * np.eye(5), xc.T @ yc)
    coef, intercept = solve_ridge(_stats(x, y, chunks=4), alpha)
    np.testing.assert_allclose(coef, w, rtol=1e-8)
    assert intercept == pytest.approx(y.mean() - x.mean(axis=0) @ w, rel=1e-8)


def test_chunking_does_not_change_stats():
    x, y = _problem(seed=3)
    one = _stats(x, y, chunks=1)
    _assert_stats_close(_stats(x, y, chunks=5), one)
    np.testing.assert_allclose(one.xtx, x.T @ x)
    np.testing.assert_allclose(one.xty, x.T @ y)
    np.testing.assert_allclose(one.sum_x, x.sum(axis=0))
    assert one.sum_y == pytest.approx(y.sum())
    assert one.count == len(y)


def test_add_and_sub_are_consistent_with_union_and_difference():
    x, y = _problem(seed=4, rows=200)
    a, b = slice(0, 130), slice(130, 200)
    stats_a, stats_b, stats_all = _stats(x[a], y[a]), _stats(x[b], y[b]), _stats(x, y)
    _assert_stats_close(stats_a + stats_b, stats_all)
    _assert_stats_close(stats_all - stats_b, stats_a)
    _assert_stats_close(stats_all - stats_a, stats_b)
    # The operators return new objects and leave their operands alone.
    before = stats_a.xtx.copy()
    _ = stats_a + stats_b
    np.testing.assert_array_equal(stats_a.xtx, before)


def test_solution_from_difference_matches_fit_on_remaining_rows():
    # The cross-validation use: fold stats = all - held-out fold.
    x, y = _problem(seed=5, rows=240)
    held_out = slice(0, 60)
    remaining = _stats(x, y, chunks=3) - _stats(x[held_out], y[held_out])
    reference = Ridge(alpha=2.0).fit(x[60:], y[60:])
    model = fit_ridge(remaining, 2.0)
    np.testing.assert_allclose(model.coef_, reference.coef_, rtol=1e-6)
    assert model.intercept_ == pytest.approx(reference.intercept_, rel=1e-6)


def test_empty_chunk_is_ignored():
    x, y = _problem(seed=6, rows=40, features=3)
    stats = _stats(x, y)
    stats.add(np.empty((0, 3)), np.empty(0))
    _assert_stats_close(stats, _stats(x, y))


def test_returns_fitted_sklearn_ridge():
    x, y = _problem(seed=7, rows=80, features=4)
    model = fit_ridge(_stats(x, y), alpha=0.5)
    assert isinstance(model, Ridge)
    assert model.alpha == 0.5
    assert model.n_features_in_ == 4
    np.testing.assert_allclose(model.predict(x), x @ model.coef_ + model.intercept_)
    with pytest.raises(ValueError):
        model.predict(x[:, :3])


def test_no_rows_is_an_error():
    with pytest.raises(ValueError):
        solve_ridge(GramStats.zeros(3), 1.0)


@pytest.mark.parametrize("alpha", [1e-3, 1.0, 100.0])
def test_weighted_rows_match_sklearn_ridge_with_sample_weight(alpha):
    x, y = _problem(seed=4)
    weights = np.random.default_rng(5).uniform(0.05, 4.0, size=len(y))
    stats = GramStats.zeros(x.shape[1])
    for rows in np.array_split(np.arange(len(y)), 3):
        stats.add(x[rows], y[rows], weights[rows])
    assert stats.count == pytest.approx(weights.sum())
    reference = Ridge(alpha=alpha).fit(x, y, sample_weight=weights)
    model = fit_ridge(stats, alpha)
    np.testing.assert_allclose(model.coef_, reference.coef_, rtol=1e-6)
    assert model.intercept_ == pytest.approx(reference.intercept_, rel=1e-6)


def test_an_integer_weight_counts_as_that_many_copies_of_the_row():
    x, y = _problem(seed=6, rows=40)
    copies = np.random.default_rng(7).integers(1, 4, size=len(y))
    weighted = GramStats.zeros(x.shape[1])
    weighted.add(x, y, copies.astype(float))
    _assert_stats_close(weighted, _stats(np.repeat(x, copies, axis=0), np.repeat(y, copies)))
