"""Interpret-mode numerics of attention_forward and typed_matmul against the references.

Split from test_kernels_numerics.py so pytest-xdist (--dist loadfile) runs both halves in parallel.
Graphs: isolated nodes (empty rows), a hub, duplicate edges, padding edges; small ``segment_slots`` force split
rows (their (m, l, acc) partials merge in the combine kernel), many nodes pack rows several to a program.
The NaN/inf cases are checked against the two-pass formula computed row by row in numpy.
Tolerances are relative, per dtype (:mod:`pallas_kernels.testing`).
"""
from __future__ import annotations

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels.testing import GTOL, TOL, make_graph
from pallas_kernels.testing import assert_close as _close
from pallas_kernels.testing import assert_finite as _finite
from pallas_kernels.testing import f32 as _f32
from pallas_kernels.testing import grads as _grads
from pallas_kernels.testing import rand as _rand

# ------------------------------------------------------------------------------------ attention_forward


def _edge_fn(C, R, E, S):
    # scores: a dot product over Dk with a shared per-head weight, plus an edge logit; values gathered by col
    return jnp.sum(C[0] * R[0] * S[0], axis=-1) + jax.nn.leaky_relu(E[0], 0.2), C[1]


# (heads, dk, dim, dtype, rate, builder, segment_slots, graph)
CASES = [
    (1, 5, 7, jnp.float32, 0.0, "numpy", None, {}),
    (4, 5, 41, jnp.bfloat16, 0.3, "jax", 8, {}),
    (8, 3, 1, jnp.float16, 0.0, "numpy", 4, {}),
    (2, 4, 602, jnp.float32, 0.2, "jax", None, dict(num_nodes=6, num_edges=10, hub=12, dups=2, pads=3, isolated=2)),
    (3, 5, 7, jnp.float64, 0.3, "numpy", 8, {}),
    (4, 5, 8, jnp.float32, 0.0, "numpy", 64, dict(num_nodes=2500, num_edges=900, hub=300)),
    (2, 3, 7, jnp.bfloat16, 0.2, "jax", 16, dict(num_nodes=9000, num_edges=700, hub=90)),
]


@pytest.mark.parametrize("heads,dk,dim,dtype,rate,builder,slots,graph", CASES)
def test_attention_forward_matches_reference(heads, dk, dim, dtype, rate, builder, slots, graph):
    rng = np.random.default_rng(heads * 100 + dim)
    with jax.enable_x64(dtype == jnp.float64):
        _, _, valid, fwd, _ = make_graph(rng, builder=builder, segment_slots=slots, **graph)
        n, e = fwd.num_rows, len(valid)
        ops = ((_rand(rng, (n, heads, dk), dtype), _rand(rng, (n, heads, dim), dtype)),
               (_rand(rng, (n, heads, dk), dtype),), (_rand(rng, (e, heads), dtype),),
               (_rand(rng, (1, heads, dk), dtype),))
        kw = dict(heads=heads, dropout_rate=rate, dropout_seed=int(rng.integers(1 << 30)) if rate else None)
        out, m, l = pk.attention_forward(_edge_fn, *ops, fwd, interpret=True, **kw)
        want = pk.attention_forward_reference(_edge_fn, *ops, fwd, **kw)
        compute = jnp.float64 if dtype == jnp.float64 else jnp.float32
        assert (out.dtype, m.dtype, l.dtype) == (dtype, compute, compute)
        deg = np.diff(np.asarray(fwd.indptr))
        assert (deg == 0).any()
        np.testing.assert_array_equal(np.asarray(out.astype(jnp.float32))[deg == 0], 0.0)
        np.testing.assert_array_equal(np.asarray(m)[deg == 0], -np.inf)
        np.testing.assert_array_equal(np.asarray(l)[deg == 0], 0.0)
        _finite(out, m[deg > 0], l)
        for got, ref in zip((out, m, l), want, strict=True):
            _close(got, ref, TOL[dtype if got is out else compute])


def _formula(scores: np.ndarray, values: np.ndarray):
    """The two-pass softmax of one row in numpy (NaN/inf as IEEE gives them)."""
    if scores.size == 0:
        return np.zeros(values.shape[1:]), -np.inf, 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(scores)
        p = np.exp(scores - m)
        l = np.sum(p)
        return np.sum((p / l)[:, None] * values, axis=0), m, l


# row -> scores: 0 empty, 1 all -inf, 2 a long -inf prefix then finite (the first chunk and first pieces are all
# -inf), 3 a NaN, 4 a +inf, 5 all masked with -1e9, 6 ordinary
SPECIAL_ROWS = {1: [-np.inf] * 3, 2: [-np.inf] * 40 + [0.5, 1.0, -2.0, 3.0, 0.0], 3: [1.0, np.nan, 2.0],
                4: [1.0, np.inf, 2.0], 5: [-1e9] * 6, 6: [0.1, 0.2, -0.3]}


def _special_graph(build, slots):
    recv = np.concatenate([np.full(len(v), k) for k, v in SPECIAL_ROWS.items()])
    scores = np.concatenate([np.asarray(v, np.float32) for v in SPECIAL_ROWS.values()])
    rng = np.random.default_rng(5)
    send = rng.integers(0, 8, recv.size)
    values = rng.normal(size=(8, 1, 3)).astype(np.float32)
    fwd, rev = build(send, recv, 8, segment_slots=slots)
    return jax.tree.map(jnp.asarray, fwd), jax.tree.map(jnp.asarray, rev), send, recv, scores, values


@pytest.mark.parametrize("build,slots", [(pk.build_csr_numpy, None), (pk.build_csr_jax, None),
                                         (pk.build_csr_numpy, 4), (pk.build_csr_jax, 8)])
def test_attention_nan_inf_and_masked_rows_follow_the_two_pass_formula(build, slots):
    fwd, _, send, recv, scores, values = _special_graph(build, slots)
    fn = lambda C, R, E, S: (E[0], C[0])
    out, m, l = pk.attention_forward(fn, (jnp.asarray(values),), (), (jnp.asarray(scores[:, None]),), (), fwd,
                                     heads=1, interpret=True)
    for row in range(8):
        sel = recv == row
        o, mm, ll = _formula(scores[sel], values[send[sel], 0])
        np.testing.assert_allclose(np.asarray(out[row, 0]), o, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(np.asarray(m[row, 0]), np.float32(mm))
        np.testing.assert_allclose(np.asarray(l[row, 0]), ll, rtol=1e-6)
    assert np.isfinite(np.asarray(out[2])).all() and float(l[5, 0]) == 6.0  # bugs (b) and (c) of issue 12
    ref = pk.attention_forward_reference(fn, (jnp.asarray(values),), (), (jnp.asarray(scores[:, None]),), (), fwd,
                                         heads=1)
    for got, want in zip((out, m, l), ref, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)


def test_attention_forward_bfloat16_literal_and_mixed_dtypes():
    rng = np.random.default_rng(6)
    _, _, valid, fwd, _ = make_graph(rng, segment_slots=8)
    n = fwd.num_rows
    k, v = _rand(rng, (n, 2, 4), jnp.bfloat16), _rand(rng, (n, 2, 3), jnp.float16)

    def fn(C, R, E, S):
        s = jnp.sum(C[0] * jnp.bfloat16(0.5), axis=-1)
        return jnp.where(s >= jnp.bfloat16(0), s, s * jnp.float16(0.2)), C[1]

    got = pk.attention_forward(fn, (k, v), (), (), (), fwd, heads=2, interpret=True)
    assert got[0].dtype == jnp.float32
    for a, b in zip(got, pk.attention_forward_reference(fn, (k, v), (), (), (), fwd, heads=2), strict=True):
        _close(a, b, TOL[jnp.float32])


def test_attention_forward_rejects_a_bad_edge_fn():
    fwd, _ = pk.build_csr_numpy(np.array([0, 1]), np.array([1, 0]), 2)
    k = jnp.ones((2, 3, 4))
    with pytest.raises(ValueError, match="must return"):
        pk.attention_forward(lambda C, R, E, S: (C[0], C[0]), (k,), (), (), (), fwd, heads=3)
    with pytest.raises(ValueError, match="dropout_seed"):
        pk.attention_forward(lambda C, R, E, S: (C[0][..., 0], C[0]), (k,), (), (), (), fwd, heads=3,
                             dropout_rate=0.5)


# --------------------------------------------------------------------------------------- typed_matmul


@pytest.mark.parametrize("din,dout,dtype,gather", [
    (41, 7, jnp.float32, True),
    (7, 64, jnp.float32, False),
    (64, 1, jnp.bfloat16, True),
])
@pytest.mark.parametrize("impl", ["pallas", "ragged_dot"])
def test_typed_matmul_matches_reference(din, dout, dtype, gather, impl):
    rng = np.random.default_rng(din * 100 + dout)
    n, num_types = 70, 4
    sizes = rng.multinomial(60, np.ones(num_types) / num_types)
    sizes[1] = 0  # an empty type
    sizes = jnp.asarray(sizes, jnp.int32)
    x, w = _rand(rng, (n, din), dtype), _rand(rng, (num_types, din, dout), dtype)
    gidx = jnp.asarray(rng.integers(0, n, 66), jnp.int32) if gather else None

    def kern(x, w):
        return pk.typed_matmul(x, w, sizes, gather_idx=gidx, impl=impl, interpret=True)

    def ref(x, w):
        return pk.typed_matmul_reference(x, w, sizes, gather_idx=gidx)

    out = kern(x, w)
    _finite(out)
    tol = dict(atol=1e-3, rtol=1e-3) if dtype == jnp.float32 else TOL[dtype]
    _close(out, ref(x, w), tol)
    assert np.all(np.asarray(out.astype(jnp.float32))[int(sizes.sum()):] == 0.0)
    cot = jnp.asarray(rng.normal(size=out.shape), jnp.float32)
    gk, gr = _grads(kern, (x, w), cot), _grads(ref, _f32((x, w)), cot)
    _finite(gk)
    for p, q in zip(gk, gr, strict=True):
        assert float(jnp.max(jnp.abs(q.astype(jnp.float32)))) > 0.0
        _close(p, q, tol if dtype == jnp.float32 else GTOL[dtype])


@pytest.mark.parametrize("dtype,kernel", [(jnp.float32, True), (jnp.bfloat16, True), (jnp.float64, False)])
def test_typed_matmul_auto_runs_the_kernel_on_narrow_floats(dtype, kernel):
    """``impl="auto"`` lowers to the Triton kernel for 16- and 32-bit floats (an H100 measured it faster than
    ragged_dot, which XLA's GPU compiler expands to a ``[groups, rows, dout]`` temporary) and to ragged_dot for
    wider types, in the forward and the backward."""
    from checks import x64

    with x64() if dtype == jnp.float64 else contextlib.nullcontext():
        x, w = jax.ShapeDtypeStruct((40, 8), dtype), jax.ShapeDtypeStruct((3, 8, 16), dtype)
        sizes = jnp.array([10, 0, 20], jnp.int32)
        loss = lambda x, w: jnp.sum(pk.typed_matmul(x, w, sizes, impl="auto").astype(jnp.float32))
        mlir = pk.compat.export_cuda_mlir(jax.grad(loss, argnums=(0, 1)), x, w)
    calls = {"gnn_typed_matmul", "gnn_typed_matmul_dw"} & set(re.findall(r"gnn_typed_matmul\w*", mlir))
    assert (calls == {"gnn_typed_matmul", "gnn_typed_matmul_dw"}) == kernel, calls
    assert ("ragged_dot" in mlir) != kernel
