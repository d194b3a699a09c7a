"""Every kernel and VJP configuration lowers through the Pallas -> Triton path for CUDA (no GPU needed).

``jax.export`` with ``platforms=["cuda"]`` runs the Triton lowering (power-of-two block shapes, no
scalar prefetch, supported primitives) but not PTX compilation. Each check differentiates the kernel
with ``jax.value_and_grad`` so the forward and all backward kernels are in the module.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels import compat

N, E = 16, 40


def _graph():
    rng = np.random.default_rng(0)
    s, r = rng.integers(0, N, E), rng.integers(0, N - 2, E)
    valid = np.arange(E) < E - 4
    return pk.build_csr_jax(s, r, N, valid)


def _count_triton(fn, *args) -> int:
    return compat.export_cuda_mlir(jax.value_and_grad(fn, argnums=tuple(range(len(args)))), *args).count(
        compat.TRITON_CUSTOM_CALL)


def _edge_fn(S, D, E_):
    return jnp.tanh(S[0] * D[0]) + E_[0] * S[1]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("width,dtype", [(1, jnp.float32), (7, jnp.float32), (41, jnp.bfloat16),
                                         (64, jnp.bfloat16), (602, jnp.float32)])
def test_gather_reduce_lowers(reduce, width, dtype):
    fwd, rev = _graph()
    x, a, w = jnp.ones((N, width), dtype), jnp.ones((N, 1), dtype), jnp.ones((E, width), dtype)

    def f(x, a, w):
        out = pk.gather_reduce(_edge_fn, (x, a), (x,), (w,), fwd, rev, reduce=reduce)
        return jnp.sum(out.astype(jnp.float32))

    # forward, src-walk and dst-walk backward; max/min first evaluate the messages and take their extremum and
    # tie count (three more). This small CSR has no split rows, so no combine kernels.
    assert _count_triton(f, x, a, w) == (3 if reduce in ("sum", "mean") else 6)


@pytest.mark.parametrize("width,dtype", [(7, jnp.float32), (41, jnp.bfloat16), (602, jnp.float32)])
def test_gather_compute_lowers(width, dtype):
    fwd, rev = _graph()
    x, a, w = jnp.ones((N, width), dtype), jnp.ones((N, 1), dtype), jnp.ones((E, width), dtype)

    def f(x, a, w):
        return jnp.sum(pk.gather_compute(_edge_fn, (x, a), (x,), (w,), fwd, rev).astype(jnp.float32) ** 2)

    assert _count_triton(f, x, a, w) == 3


def _score_fn(S, D, E_):
    return jnp.sum(S[0] * D[0], axis=-1) + jax.nn.leaky_relu(E_[0], 0.2)


@pytest.mark.parametrize("value_index", ["src", "edge"])
@pytest.mark.parametrize("rate", [0.0, 0.2])
@pytest.mark.parametrize("heads,dim,dtype", [(1, 7, jnp.float32), (4, 41, jnp.bfloat16), (8, 64, jnp.float32)])
def test_attention_lowers(value_index, rate, heads, dim, dtype):
    fwd, rev = _graph()
    k, q = jnp.ones((N, heads, 5), dtype), jnp.ones((N, heads, 5), dtype)
    el = jnp.ones((E, heads), dtype)
    vals = jnp.ones((N if value_index == "src" else E, heads, dim), dtype)

    def f(k, q, el, vals):
        out = pk.attention_aggregate(_score_fn, (k,), (q,), (el,), vals, fwd, rev, value_index=value_index,
                                     dropout_rate=rate, dropout_seed=jnp.int32(3) if rate else None)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    assert _count_triton(f, k, q, el, vals) == 3


@pytest.mark.parametrize("din,dout,dtype", [(7, 41, jnp.float32), (64, 1, jnp.bfloat16), (602, 16, jnp.float32)])
@pytest.mark.parametrize("gather", [False, True])
def test_typed_matmul_pallas_lowers(din, dout, dtype, gather):
    x, w = jnp.ones((N, din), dtype), jnp.ones((3, din, dout), dtype)
    sizes = jnp.array([5, 0, 9], jnp.int32)
    gidx = jnp.arange(14, dtype=jnp.int32) % N if gather else None

    def f(x, w):
        out = pk.typed_matmul(x, w, sizes, gather_idx=gidx, impl="pallas")
        return jnp.sum(out.astype(jnp.float32) ** 2)

    assert _count_triton(f, x, w) == 3  # forward, dx, dW
