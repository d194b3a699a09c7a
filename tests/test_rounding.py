"""`jgnn.ops.rounding`: a bound on a computation's rounding error, whatever order and contraction compute it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgnn.ops import rounding

EPS32 = float(jnp.finfo(jnp.float32).eps)


def _score(x, w, b):
    """A GAT-like score: a dot product, a bias and a leaky_relu (a `jnp.where`)."""
    return jax.nn.leaky_relu(x @ w + b, 0.2)


@pytest.mark.parametrize("scale", [1.0, 1e19])
def test_the_bound_covers_the_float32_error_of_a_cancelling_score(scale):
    """Terms near ``scale`` that sum to far less: float32's error is ulps of the terms, and within the bound."""
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(64, 8)) * scale).astype(np.float32)
    w = rng.normal(size=(8,)).astype(np.float32)
    b = np.float32(0.5 * scale)
    (got,), (bound,) = rounding.bound(_score, x, w, b)
    exact = _score(x.astype(np.float64), w.astype(np.float64), np.float64(b))
    err = np.abs(np.asarray(got, np.float64) - exact)
    assert np.all(err <= EPS32 * np.asarray(bound, np.float64))
    # the bound is of the terms, not of the score: here it is far wider than ulps of the score alone
    assert np.max(np.asarray(bound) / np.maximum(np.abs(np.asarray(got)), 1e-30 * scale)) > 10


def test_custom_derivative_functions_and_calls_are_bounded_inside():
    (y,), (bound,) = rounding.bound(lambda x: jax.jit(jax.nn.relu)(x) * 3.0 + jnp.tanh(x),
                                    jnp.array([-1.0, 2.0], jnp.float32))
    np.testing.assert_allclose(y, [-np.tanh(1.0), 6 + np.tanh(2.0)], rtol=1e-6)
    assert bound is not None and np.all(np.asarray(bound) > 0)


def test_bounds_are_magnitudes_through_negation_and_subtraction():
    (y,), (bound,) = rounding.bound(lambda x, w: -(x @ w) - x[0], jnp.array([3.0, -1.0], jnp.float32),
                                    jnp.array([1.0, 2.0], jnp.float32))
    assert float(y) == -4.0 and float(bound) >= 2 * 5.0  # the dot's terms (3 and 2) twice, and its own rounding


def test_a_primitive_without_a_rule_gives_no_bound():
    (_,), (bound,) = rounding.bound(lambda x: jax.lax.erf(x) + x, jnp.ones((3,), jnp.float32))
    assert bound is None


def test_integer_and_boolean_outputs_carry_no_bound_and_floats_made_of_them_one_rounding():
    _, bounds = rounding.bound(lambda x: (x > 0, x.astype(jnp.int32), x * 2.0, (x > 0).astype(jnp.float32) * x),
                               jnp.array([-1.0, 3.0, 2.0], jnp.float32))
    assert bounds[0] is None and bounds[1] is None
    np.testing.assert_allclose(bounds[2], [2.0, 6.0, 4.0])
    np.testing.assert_allclose(bounds[3], [0.0, 6.0, 4.0])  # 1 ulp of the 0/1 mask times |x|, 1 of the product
