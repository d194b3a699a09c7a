"""Non-interpreted (Triton) runs of every kernel on a power-law graph with a ~23k in-degree hub; skipped
without a GPU. Forward entry points against their references (host and traced CSRs, so split rows and the
combine kernel run), and the wrappers' gradients against JAX's gradients of the references."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk

pytestmark = pytest.mark.gpu

N, E = 5000, 60000
TOL = dict(atol=2e-3, rtol=2e-3)  # float32 sums of up to ~23k terms in another order


def _graph(seed, builder=pk.build_csr_jax):
    rng = np.random.default_rng(seed)
    s = rng.integers(0, N, E)
    r = np.minimum(rng.zipf(1.5, E), N - 10) - 1  # power-law in-degree: real hubs
    valid = rng.random(E) > 0.02
    return rng, builder(s, r, N, valid)


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), **TOL)


def _rand(rng, shape, scale=1.0):
    return jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)


def _edge_fn(C, R, E_, S):
    return jnp.tanh(C[0] * R[0]) + E_[0] * C[1] + S[0]


@pytest.mark.parametrize("builder", [pk.build_csr_jax, pk.build_csr_numpy])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("width", [7, 64, 602])
def test_gather_reduce_forward_gpu(reduce, width, builder):
    rng, (fwd, _) = _graph(width, builder)
    ops = ((_rand(rng, (N, width)), _rand(rng, (N, 1))), (_rand(rng, (N, width)),), (_rand(rng, (E, width)),),
           (_rand(rng, (1, width)),))
    out = jax.jit(lambda *o: pk.gather_reduce_forward(_edge_fn, *o, fwd, reduce=reduce))(*ops)
    _close(out, pk.gather_reduce_forward_reference(_edge_fn, *ops, fwd, reduce=reduce))


def test_gather_compute_forward_gpu():
    rng, (fwd, _) = _graph(1)
    ops = ((_rand(rng, (N, 41)), _rand(rng, (N, 1))), (_rand(rng, (N, 41)),), (_rand(rng, (E, 41)),), ())
    fn = lambda C, R, E_, S: jnp.tanh(C[0] * R[0]) + E_[0] * C[1]
    out = jax.jit(lambda *o: pk.gather_compute_forward(fn, *o, fwd, num_edges=E))(*ops)
    _close(out, pk.gather_compute_forward_reference(fn, *ops, fwd, num_edges=E))


@pytest.mark.parametrize("heads,dim,rate", [(4, 32, 0.0), (8, 8, 0.2), (8, 602, 0.0)])
def test_attention_forward_gpu(heads, dim, rate):
    rng, (fwd, _) = _graph(heads)
    ops = ((_rand(rng, (N, heads, 16), 0.3), _rand(rng, (N, heads, dim))), (_rand(rng, (N, heads, 16), 0.3),),
           (_rand(rng, (E, heads)),), ())
    fn = lambda C, R, E_, S: (jnp.sum(C[0] * R[0], axis=-1) + E_[0], C[1])
    kw = dict(heads=heads, dropout_rate=rate, dropout_seed=11 if rate else None)
    got = jax.jit(lambda *o: pk.attention_forward(fn, *o, fwd, **kw))(*ops)
    for a, b in zip(got, pk.attention_forward_reference(fn, *ops, fwd, **kw), strict=True):
        _close(a, b)


def _check_grads(kern, ref, args):
    out = jax.jit(kern)(*args)
    _close(out, ref(*args))
    cot = jnp.ones(out.shape, jnp.float32) * 0.01
    gk = jax.jit(jax.grad(lambda *a: jnp.sum(kern(*a) * cot), argnums=tuple(range(len(args)))))(*args)
    gr = jax.grad(lambda *a: jnp.sum(ref(*a) * cot), argnums=tuple(range(len(args))))(*args)
    for p, q in zip(gk, gr, strict=True):
        _close(p, q)


def _edge_fn3(S, D, E_):
    return jnp.tanh(S[0] * D[0]) + E_[0] * S[1]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_gather_reduce_gradient_gpu(reduce):
    rng, (fwd, rev) = _graph(2)
    args = (_rand(rng, (N, 64)), _rand(rng, (N, 1)), _rand(rng, (E, 64)))
    _check_grads(lambda x, a, w: pk.gather_reduce(_edge_fn3, (x, a), (x,), (w,), fwd, rev, reduce=reduce),
                 lambda x, a, w: pk.gather_reduce_reference(_edge_fn3, (x, a), (x,), (w,), fwd, rev, reduce=reduce),
                 args)


def test_gather_compute_gradient_gpu():
    rng, (fwd, rev) = _graph(3)
    args = (_rand(rng, (N, 41)), _rand(rng, (N, 1)), _rand(rng, (E, 41)))
    _check_grads(lambda x, a, w: pk.gather_compute(_edge_fn3, (x, a), (x,), (w,), fwd, rev),
                 lambda x, a, w: pk.gather_compute_reference(_edge_fn3, (x, a), (x,), (w,), fwd, rev), args)


@pytest.mark.parametrize("value_index,rate", [("src", 0.0), ("src", 0.2), ("edge", 0.0)])
def test_attention_gradient_gpu(value_index, rate):
    rng, (fwd, rev) = _graph(4)
    heads, dk, dim = 4, 16, 32
    args = (_rand(rng, (N, heads, dk), 0.3), _rand(rng, (N, heads, dk), 0.3), _rand(rng, (E, heads)),
            _rand(rng, (N if value_index == "src" else E, heads, dim)))
    kw = dict(value_index=value_index, dropout_rate=rate, dropout_seed=11 if rate else None)
    score = lambda S, D, E_: jnp.sum(S[0] * D[0], axis=-1) + E_[0]
    _check_grads(lambda *a: pk.attention_aggregate(score, (a[0],), (a[1],), (a[2],), a[3], fwd, rev, **kw),
                 lambda *a: pk.attention_aggregate_reference(score, (a[0],), (a[1],), (a[2],), a[3], fwd, rev, **kw),
                 args)


def test_typed_matmul_gpu():
    rng = np.random.default_rng(5)
    x = _rand(rng, (4000, 64))
    w = _rand(rng, (5, 64, 48), 0.1)
    sizes = jnp.asarray([1000, 0, 1500, 700, 600], jnp.int32)
    gidx = jnp.asarray(rng.integers(0, 4000, 3900), jnp.int32)
    _check_grads(lambda x, w: pk.typed_matmul(x, w, sizes, gather_idx=gidx, impl="pallas"),
                 lambda x, w: pk.typed_matmul_reference(x, w, sizes, gather_idx=gidx), (x, w))
