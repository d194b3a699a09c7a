"""Interpret-mode numerics of every pallas_kernels kernel and its VJP against the pure-jnp references.

Graphs contain the awkward cases: isolated nodes (empty rows), a hub with a few hundred in-edges
(several edge chunks), duplicate edges (ties for max/min), and jraph-style padding edges
(``valid == False``) that all point at node 0 and must not turn it into a fake hub.

Unwritten outputs: the Pallas HLO interpreter fills every non-aliased output with NaN (floats), so the
``_finite`` assertions fail on any row or lane a kernel forgets to write.

Tolerances: float32 kernels accumulate in float32 like the references -> atol/rtol 1e-4 (grads 2e-4,
different summation order); bfloat16 outputs are rounded to 8 mantissa bits -> rtol/atol 3e-2.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pallas_kernels as pk
from pallas_kernels import dropout as dr
from pallas_kernels.testing import GTOL, TOL, make_graph
from pallas_kernels.testing import assert_close as _close
from pallas_kernels.testing import assert_finite as _finite
from pallas_kernels.testing import f32 as _f32
from pallas_kernels.testing import grads as _grads
from pallas_kernels.testing import rand as _rand

# ------------------------------------------------------------------------------------------------ CSR


def test_csr_builders_agree_and_exclude_padding():
    rng = np.random.default_rng()
    s, r, valid, fwd, rev = make_graph(rng)
    jfwd, jrev = pk.build_csr_jax(s, r, 24, valid)
    for a, b in ((fwd, jfwd), (rev, jrev)):
        nnz = int(a.indptr[-1])
        assert nnz == int(valid.sum())
        np.testing.assert_array_equal(a.indptr, b.indptr)
        np.testing.assert_array_equal(a.col, b.col[:nnz])
        np.testing.assert_array_equal(a.eid, b.eid[:nnz])
        np.testing.assert_array_equal(a.row_order, b.row_order)
        assert valid[np.asarray(a.eid)].all()
        deg = np.diff(np.asarray(a.indptr))
        assert (np.diff(deg[np.asarray(a.row_order)]) <= 0).all()
    # padding edges all point at node 0, yet node 0's degree only counts real edges
    assert int(fwd.indptr[1] - fwd.indptr[0]) == int(((r == 0) & valid).sum())


def test_dropout_mask_rate_and_determinism():
    eid = jnp.arange(20000, dtype=jnp.int32)[:, None]
    head = jnp.arange(4, dtype=jnp.int32)[None, :]
    keep = pk.edge_dropout_keep(5, eid, head, 0.25)
    assert abs(float(keep.mean()) - 0.75) < 0.01
    np.testing.assert_array_equal(keep, pk.edge_dropout_keep(jnp.int32(5), eid, head, 0.25))
    assert float(jnp.mean(keep != pk.edge_dropout_keep(6, eid, head, 0.25))) > 0.2
    assert bool(jnp.all(pk.edge_dropout_keep(5, eid, head, 0.0)))
    assert int(jnp.max(dr.edge_dropout_bits(1, eid, head))) < 2**24


# ------------------------------------------------------------------------------------- gather_reduce


def _edge_fn(S, D, E):
    # lane-wise; mixes width-F and width-1 operands; tanh keeps values O(1)
    return jnp.tanh(S[0] * D[0]) + E[0] * S[1]


def _linear_in_edge(S, D, E):
    # the pullback never reads E[0]: sum/mean keep no copy of it for the backward
    return jnp.tanh(S[0] * D[0]) + E[0] * 0.5


def _reduce_case(rng, width, dtype, reduce, edge_fn=_edge_fn, **graph_kw):
    _, _, _, fwd, rev = make_graph(rng, **graph_kw)
    n, e = fwd.num_rows, fwd.eid.shape[0]
    x = _rand(rng, (n, width), dtype)
    a = _rand(rng, (n, 1), dtype)
    w = _rand(rng, (e, width), dtype)

    def kern(x, a, w):
        return pk.gather_reduce(edge_fn, (x, a), (x,), (w,), fwd, rev, reduce=reduce, interpret=True)

    def ref(x, a, w):
        return pk.gather_reduce_reference(edge_fn, (x, a), (x,), (w,), fwd, rev, reduce=reduce)

    out = kern(x, a, w)
    _finite(out)
    _close(out, ref(x, a, w), TOL[dtype])
    deg = np.diff(np.asarray(fwd.indptr))
    assert np.all(np.asarray(out.astype(jnp.float32))[deg == 0] == 0.0), "empty rows must give 0"
    cot = jax.random.normal(jax.random.key(int(rng.integers(1 << 30))), out.shape)
    gk, gr = _grads(kern, (x, a, w), cot), _grads(ref, _f32((x, a, w)), cot)
    _finite(gk)
    for p, q in zip(gk, gr, strict=True):
        _close(p, q, GTOL[dtype])
    return kern, (x, a, w)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("width,dtype", [(7, jnp.float32), (41, jnp.bfloat16)])
def test_gather_reduce_matches_reference(reduce, width, dtype):
    _reduce_case(np.random.default_rng(), width, dtype, reduce)


@pytest.mark.parametrize("width,reduce", [(1, "max"), (64, "sum")])
def test_gather_reduce_widths(width, reduce):
    _reduce_case(np.random.default_rng(), width, jnp.float32, reduce, builder="jax")


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_gather_reduce_keeps_an_edge_operand_only_if_its_backward_reads_it(reduce):
    from jax._src.ad_checkpoint import saved_residuals

    kern, (x, a, w) = _reduce_case(np.random.default_rng(), 7, jnp.float32, reduce, edge_fn=_linear_in_edge)
    kept = [r for r, _ in saved_residuals(lambda w: jnp.sum(kern(x, a, w)), w) if r.shape == w.shape]
    # max/min recompute the values in the backward to find the chosen edge, so they keep it
    assert (not kept) if reduce in ("sum", "mean") else kept


def test_gather_reduce_width_602_tiny_graph():
    _reduce_case(np.random.default_rng(), 602, jnp.float32, "mean", num_nodes=6, num_edges=10, hub=12, dups=2,
                 pads=3, isolated=2)


# Edge-free graphs (E == 0) are out of scope: callers skip the kernel when there are no edges.
@settings(max_examples=3, deadline=None)
@given(num_nodes=st.integers(2, 12), num_edges=st.integers(1, 30), hub=st.integers(0, 70),
       pads=st.integers(0, 4), reduce=st.sampled_from(["sum", "max"]))
def test_gather_reduce_random_graph_shapes(num_nodes, num_edges, hub, pads, reduce):
    _reduce_case(np.random.default_rng(), 3, jnp.float32, reduce, num_nodes=num_nodes, num_edges=num_edges,
                 hub=hub, dups=min(2, num_edges), pads=pads, isolated=1)


# ------------------------------------------------------------------------------------ gather_compute


@pytest.mark.parametrize("width,dtype,builder", [(7, jnp.float32, "jax"), (41, jnp.bfloat16, "numpy")])
def test_gather_compute_matches_reference(width, dtype, builder):
    rng = np.random.default_rng()
    _, _, valid, fwd, rev = make_graph(rng, builder=builder)
    n, e = fwd.num_rows, len(valid)
    x, a, w = _rand(rng, (n, width), dtype), _rand(rng, (n, 1), dtype), _rand(rng, (e, width), dtype)

    def kern(x, a, w):
        return pk.gather_compute(_edge_fn, (x, a), (x,), (w,), fwd, rev, interpret=True)

    def ref(x, a, w):
        return pk.gather_compute_reference(_edge_fn, (x, a), (x,), (w,), fwd, rev)

    out = kern(x, a, w)
    _finite(out)
    _close(out, ref(x, a, w), TOL[dtype])
    assert np.all(np.asarray(out.astype(jnp.float32))[~valid] == 0.0), "padding edges must give 0"
    cot = jnp.asarray(rng.normal(size=out.shape), jnp.float32)
    gk, gr = _grads(kern, (x, a, w), cot), _grads(ref, _f32((x, a, w)), cot)
    _finite(gk)
    for p, q in zip(gk, gr, strict=True):
        _close(p, q, GTOL[dtype])


