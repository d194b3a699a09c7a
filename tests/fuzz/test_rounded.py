"""The rounded oracle (`tests.fuzz.rounded`): every operation in float64, its result rounded once to its dtype."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tests.fuzz import rounded


def _mean(x, ids, n):
    total = jax.ops.segment_sum(x, ids, n)
    return total / jnp.maximum(jax.ops.segment_sum(jnp.ones_like(x[:, :1]), ids, n), 1)


def test_a_float16_mean_whose_sum_overflows_is_inf():
    """A hub of 1,050 in-edges with features 6,804: the mean fits float16, the sum (7.1e6) does not."""
    x = np.full((1050, 3), 6804, np.float16)
    ids = np.zeros(1050, np.int32)
    got = rounded.evaluate(jax.jit(lambda x: _mean(x, ids, 2)), x)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(np.asarray(got), [[np.inf] * 3, [0.0] * 3])
    with jax.enable_x64(True):
        np.testing.assert_allclose(np.asarray(_mean(x.astype(np.float64), ids, 2))[0], 6804)  # what float64 says


def test_a_float16_segment_sum_is_rounded_once():
    """2048 + eight 1s: float16 partial sums stay at 2048 (its ulp there is 2); the sum rounded once is 2056."""
    x = np.array([2048] + [1] * 8, np.float16)
    ids = np.zeros(9, np.int32)
    got = rounded.evaluate(lambda x: (jax.ops.segment_sum(x, ids, 1), x @ x), x)
    assert float(got[0][0]) == 2056 and got[0].dtype == np.float16
    assert np.isposinf(float(got[1]))  # 2048² + 8 is past float16's range


def test_gradients_are_rounded_per_operation_too():
    x = np.array([0.5, 1.5, -2.0], np.float16)
    got = rounded.evaluate(jax.grad(lambda x: jnp.sum(jnp.exp(x) * x)), x)
    want = np.exp(x.astype(np.float64)) * (1 + x.astype(np.float64))
    assert got.dtype == np.float16
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-3)
