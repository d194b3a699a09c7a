"""Non-interpreted (Triton) runs of every kernel on a moderately large random graph; skipped without a GPU."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk

pytestmark = pytest.mark.gpu

N, E = 5000, 60000


def _graph(rng):
    s = rng.integers(0, N, E)
    r = np.minimum(rng.zipf(1.5, E), N - 10) - 1  # power-law in-degree: real hubs
    valid = rng.random(E) > 0.02
    return pk.build_csr_jax(s, r, N, valid)


def _close(a, b, tol=2e-3):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=tol, rtol=tol)


def _check(kern, ref, args):
    out = jax.jit(kern)(*args)
    _close(out, ref(*args))
    cot = jnp.ones(out.shape, jnp.float32) * 0.01
    gk = jax.jit(jax.grad(lambda *a: jnp.sum(kern(*a) * cot), argnums=tuple(range(len(args)))))(*args)
    gr = jax.grad(lambda *a: jnp.sum(ref(*a) * cot), argnums=tuple(range(len(args))))(*args)
    for p, q in zip(gk, gr, strict=True):
        _close(p, q)


def _edge_fn(S, D, E_):
    return jnp.tanh(S[0] * D[0]) + E_[0] * S[1]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("width", [7, 64])
def test_gather_reduce_gpu(reduce, width):
    rng = np.random.default_rng()
    fwd, rev = _graph(rng)
    x = jnp.asarray(rng.normal(size=(N, width)), jnp.float32)
    a = jnp.asarray(rng.normal(size=(N, 1)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(E, width)), jnp.float32)
    _check(lambda x, a, w: pk.gather_reduce(_edge_fn, (x, a), (x,), (w,), fwd, rev, reduce=reduce),
           lambda x, a, w: pk.gather_reduce_reference(_edge_fn, (x, a), (x,), (w,), fwd, rev, reduce=reduce),
           (x, a, w))


def test_gather_compute_gpu():
    rng = np.random.default_rng()
    fwd, rev = _graph(rng)
    x = jnp.asarray(rng.normal(size=(N, 41)), jnp.float32)
    a = jnp.asarray(rng.normal(size=(N, 1)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(E, 41)), jnp.float32)
    _check(lambda x, a, w: pk.gather_compute(_edge_fn, (x, a), (x,), (w,), fwd, rev),
           lambda x, a, w: pk.gather_compute_reference(_edge_fn, (x, a), (x,), (w,), fwd, rev), (x, a, w))


@pytest.mark.parametrize("value_index,rate", [("src", 0.0), ("src", 0.2), ("edge", 0.0)])
def test_attention_gpu(value_index, rate):
    rng = np.random.default_rng()
    fwd, rev = _graph(rng)
    heads, dk, dim = 4, 16, 32
    k = jnp.asarray(rng.normal(size=(N, heads, dk)), jnp.float32) * 0.3
    q = jnp.asarray(rng.normal(size=(N, heads, dk)), jnp.float32) * 0.3
    el = jnp.asarray(rng.normal(size=(E, heads)), jnp.float32)
    vals = jnp.asarray(rng.normal(size=(N if value_index == "src" else E, heads, dim)), jnp.float32)
    kw = dict(value_index=value_index, dropout_rate=rate, dropout_seed=11 if rate else None)

    def score(S, D, E_):
        return jnp.sum(S[0] * D[0], axis=-1) + E_[0]

    _check(lambda *a: pk.attention_aggregate(score, (a[0],), (a[1],), (a[2],), a[3], fwd, rev, **kw),
           lambda *a: pk.attention_aggregate_reference(score, (a[0],), (a[1],), (a[2],), a[3], fwd, rev, **kw),
           (k, q, el, vals))


def test_typed_matmul_gpu():
    rng = np.random.default_rng()
    x = jnp.asarray(rng.normal(size=(4000, 64)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(5, 64, 48)), jnp.float32) * 0.1
    sizes = jnp.asarray([1000, 0, 1500, 700, 600], jnp.int32)
    gidx = jnp.asarray(rng.integers(0, 4000, 3900), jnp.int32)
    _check(lambda x, w: pk.typed_matmul(x, w, sizes, gather_idx=gidx, impl="pallas"),
           lambda x, w: pk.typed_matmul_reference(x, w, sizes, gather_idx=gidx), (x, w))
