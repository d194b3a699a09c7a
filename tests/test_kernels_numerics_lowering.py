"""Every kernel entry point lowers through Pallas -> Triton for CUDA (no GPU needed).

``jax.export`` with ``platforms=["cuda"]`` (``compat.export_cuda_mlir``) runs the Triton lowering (power-of-two
block shapes, supported primitives, reshapes of the lane merge) but not PTX compilation. The CSRs have split
rows, so each reducing walk is a main kernel plus a combine kernel. Derivatives are jgnn's edge ops on these same
kernels (``tests/test_kernels_lowering.py``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels import compat

N, E = 16, 40


def _graph(builder):
    rng = np.random.default_rng(0)
    s, r = rng.integers(0, N, E), rng.integers(0, N - 2, E)
    r[:12] = 3  # a hub longer than one segment: split into pieces
    valid = np.arange(E) < E - 4
    return builder(s, r, N, valid, segment_slots=4)


def _count(fn, *args) -> int:
    return compat.export_cuda_mlir(fn, *args).count(compat.TRITON_CUSTOM_CALL)


def _edge_fn(C, R, E_, S):
    return jnp.tanh(C[0] * R[0]) + E_[0] * C[1] + S[0]


REDUCING = 2  # main walk + combine of split rows


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("width,dtype,builder", [(1, jnp.float32, pk.build_csr_jax),
                                                 (7, jnp.bfloat16, pk.build_csr_numpy),
                                                 (41, jnp.float16, pk.build_csr_jax),
                                                 (64, jnp.float32, pk.build_csr_numpy),
                                                 (602, jnp.bfloat16, pk.build_csr_jax)])
def test_gather_reduce_forward_lowers(reduce, width, dtype, builder):
    fwd, _ = _graph(builder)
    x, a, w, sh = (jnp.ones(s, dtype) for s in ((N, width), (N, 1), (E, width), (1, width)))
    fn = lambda x, a, w, sh: pk.gather_reduce_forward(_edge_fn, (x, a), (x,), (w,), (sh,), fwd, reduce=reduce)
    assert _count(fn, x, a, w, sh) == REDUCING


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.float64])
def test_integer_and_float64_kernels_lower(dtype):
    fwd, _ = _graph(pk.build_csr_numpy)
    with jax.enable_x64(dtype == jnp.float64):
        x = jnp.ones((N, 7), dtype)
        fn = lambda x: pk.gather_reduce_forward(lambda C, R, E_, S: C[0] * 2, (x,), (), (), (), fwd, reduce="max")
        assert _count(fn, x) == REDUCING


@pytest.mark.parametrize("width,dtype", [(1, jnp.float32), (41, jnp.bfloat16), (602, jnp.float16)])
def test_gather_compute_forward_lowers(width, dtype):
    fwd, _ = _graph(pk.build_csr_jax)
    x, a, w, sh = (jnp.ones(s, dtype) for s in ((N, width), (N, 1), (E, width), (1, width)))
    fn = lambda x, a, w, sh: pk.gather_compute_forward(_edge_fn, (x, a), (x,), (w,), (sh,), fwd, num_edges=E)
    assert _count(fn, x, a, w, sh) == 1  # slots write their edges: nothing to combine


def _attn_fn(C, R, E_, S):
    return jnp.sum(C[0] * R[0] * S[0], axis=-1) + E_[0], C[1]


@pytest.mark.parametrize("rate", [0.0, 0.2])
@pytest.mark.parametrize("heads,dim,dtype,builder", [(1, 7, jnp.float32, pk.build_csr_jax),
                                                     (4, 41, jnp.bfloat16, pk.build_csr_numpy),
                                                     (8, 64, jnp.float16, pk.build_csr_jax),
                                                     (8, 602, jnp.float32, pk.build_csr_numpy)])
def test_attention_forward_lowers(rate, heads, dim, dtype, builder):
    fwd, _ = _graph(builder)
    k, v, el, sh = (jnp.ones(s, dtype) for s in ((N, heads, 5), (N, heads, dim), (E, heads), (1, heads, 5)))
    fn = lambda k, v, el, sh: pk.attention_forward(_attn_fn, (k, v), (k,), (el,), (sh,), fwd, heads=heads,
                                                   dropout_rate=rate, dropout_seed=jnp.int32(3) if rate else None)
    assert _count(fn, k, v, el, sh) == REDUCING
