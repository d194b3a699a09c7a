"""Interpret-mode numerics of the CSR builders, the work list, gather_reduce and gather_compute against the
pure-jnp references (which are checked against plain ``jax.ops`` segment code over the edge list).

Graphs contain the awkward cases: isolated nodes (empty rows), a hub with a few hundred in-edges, duplicate
edges (max/min ties), and jraph-style padding edges (``valid == False``) that all point at node 0 and must not
turn it into a fake hub. ``segment_slots`` small forces split rows (pieces in several programs and the combine
kernel); many nodes make several rows share a program (``lanes`` < ``block``).

Unwritten outputs: the Pallas HLO interpreter fills every non-aliased output with NaN, so the finiteness checks
fail on any row or lane a kernel forgets to write. Tolerances are relative, per dtype
(:mod:`pallas_kernels.testing`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pallas_kernels as pk
from pallas_kernels import _config, schedule
from pallas_kernels import dropout as dr
from pallas_kernels.describe import describe_schedule
from pallas_kernels.testing import TOL, make_graph
from pallas_kernels.testing import assert_close as _close
from pallas_kernels.testing import assert_finite as _finite
from pallas_kernels.testing import rand as _rand

# -------------------------------------------------------------------------------------------- CSR + schedule


def test_csr_builders_agree_and_exclude_padding():
    rng = np.random.default_rng(0)
    s, r, valid, fwd, rev = make_graph(rng)
    jfwd, jrev = pk.build_csr_jax(s, r, 24, valid)
    for a, b in ((fwd, jfwd), (rev, jrev)):
        nnz = int(a.indptr[-1])
        assert nnz == int(valid.sum())
        np.testing.assert_array_equal(a.indptr, b.indptr)
        np.testing.assert_array_equal(a.col, b.col[:nnz])
        np.testing.assert_array_equal(a.eid, b.eid[:nnz])
        assert valid[np.asarray(a.eid)].all()
    # padding edges all point at node 0, yet node 0's degree only counts real edges
    assert int(fwd.indptr[1] - fwd.indptr[0]) == int(((r == 0) & valid).sum())


@pytest.mark.parametrize("build", [pk.build_csr_numpy, pk.build_csr_jax])
def test_csr_drops_out_of_range_receivers_and_clamps_senders(build):
    s = np.array([0, 1, 9, -3, 2, 1, 4])
    r = np.array([1, -1, 2, 0, 5, 3, 2])  # -1 and 5 are outside [0, 5): those edges are in neither CSR
    fwd, rev = build(s, r, 5)
    nnz = int(fwd.indptr[-1])
    assert sorted(np.asarray(fwd.eid[:nnz]).tolist()) == [0, 2, 3, 5, 6]
    np.testing.assert_array_equal(np.diff(np.asarray(fwd.indptr)), [1, 1, 2, 1, 0])
    # the reverse CSR files sender 9 under node 4 and sender -3 under node 0 (gather clamping)
    np.testing.assert_array_equal(np.diff(np.asarray(rev.indptr)), [2, 1, 0, 0, 2])
    assert int(rev.indptr[-1]) == nnz


def _covered(csr) -> list[int]:
    seg = jax.tree.map(np.asarray, csr.segments)
    real = seg.row < csr.num_rows
    return sorted(s for a, b in zip(seg.start[real], seg.end[real], strict=True) for s in range(a, b))


_traced_build = jax.jit(pk.build_csr_jax, static_argnums=2, static_argnames="segment_slots")


@settings(max_examples=16, deadline=None)
@given(num_nodes=st.integers(1, 40), num_edges=st.integers(0, 120), hub=st.integers(0, 150),
       slots=st.sampled_from([1, 3, 8, 64]), seed=st.integers(0, 2**31 - 1))
def test_schedule_covers_every_slot_once_and_traced_matches_host(num_nodes, num_edges, hub, slots, seed):
    # Fixed array sizes (40 rows, 270 edges, the unused ones invalid) so the traced builder compiles once per slots.
    rng = np.random.default_rng(seed)
    nnz = num_edges + hub
    s = rng.integers(0, num_nodes, 270)
    r = np.concatenate([rng.integers(0, num_nodes, num_edges), np.zeros(270 - num_edges, int)])
    valid = np.arange(270) < nnz
    num_nodes = 40
    host, _ = pk.build_csr_numpy(s, r, num_nodes, valid, segment_slots=slots)
    traced, _ = _traced_build(s, r, num_nodes, valid, segment_slots=slots)
    assert _covered(host) == list(range(nnz)) == _covered(traced)
    for csr in (host, traced):
        seg = jax.tree.map(np.asarray, csr.segments)
        length = seg.end - seg.start
        assert (length <= slots).all() and (np.diff(length) <= 0).all()  # longest first: trip count of a program
        deg = np.diff(np.asarray(csr.indptr))
        rows = seg.row[seg.row < num_nodes]
        # a row is split iff it is longer than one segment; whole rows own exactly one segment
        np.testing.assert_array_equal(np.bincount(rows, minlength=num_nodes), np.maximum(1, -(-deg // slots)))
        comb = jax.tree.map(np.asarray, csr.combine)
        split = comb.row < num_nodes
        np.testing.assert_array_equal(np.sort(comb.row[split]), np.nonzero(deg > slots)[0])
        for row, first, count in zip(comb.row[split], comb.first[split], comb.count[split], strict=True):
            parts = np.sort(seg.part[seg.row == row])
            np.testing.assert_array_equal(parts, np.arange(first, first + count))
            assert (comb.part_row[first:first + count] == row).all()
        assert (seg.part[np.isin(seg.row, comb.row[split], invert=True)] == -1).all()
    bound = schedule.bounds(num_nodes, len(s), slots)
    assert tuple(len(x) for x in (traced.segments.row, traced.combine.row, traced.combine.part_row)) == bound
    assert len(host.segments.row) <= bound[0] and len(host.combine.part_row) <= bound[2]


def _zipf_csr():
    rng = np.random.default_rng(0)
    n, e = 5000, 60000
    s = rng.integers(0, n, e)
    r = np.minimum(rng.zipf(1.5, e), n - 10) - 1  # node 0 gets ~23k in-edges
    return pk.build_csr_numpy(s, r, n)[0], np.bincount(r, minlength=n)


@pytest.mark.parametrize("kernel,shapes", [
    ("gather_reduce", dict(col=[(64,)], row=[(64,)])),
    ("gather_compute", dict(col=[(602,)], edge=[(1,)])),
    ("attention", dict(col=[(8, 8), (8,)], row=[(8,)], heads=8, value_dim=8)),
])
def test_schedule_of_a_20k_hub_walks_at_most_64_chunks(kernel, shapes):
    csr, deg = _zipf_csr()
    assert deg.max() > 20000
    rep = describe_schedule(csr, kernel=kernel, **shapes)
    assert rep.serial_chunks <= 64
    assert rep.edges == deg.sum()
    # one program per row of 32 lanes would mask the lanes a power-law graph leaves empty
    walked = (-(-deg // 32)).sum() * 32
    assert rep.masked_lane_fraction < 1 - deg.sum() / walked
    assert rep.programs >= _config.MIN_PROGRAMS
    assert rep.min_bytes_per_edge <= rep.bytes_per_edge


def test_dropout_mask_rate_and_determinism():
    eid = jnp.arange(20000, dtype=jnp.int32)[:, None]
    head = jnp.arange(4, dtype=jnp.int32)[None, :]
    keep = pk.edge_dropout_keep(5, eid, head, 0.25)
    assert abs(float(keep.mean()) - 0.75) < 0.01
    np.testing.assert_array_equal(keep, pk.edge_dropout_keep(jnp.int32(5), eid, head, 0.25))
    assert float(jnp.mean(keep != pk.edge_dropout_keep(6, eid, head, 0.25))) > 0.2
    assert bool(jnp.all(pk.edge_dropout_keep(5, eid, head, 0.0)))
    assert int(jnp.max(dr.edge_dropout_bits(1, eid, head))) < 2**24


# ------------------------------------------------------------------------------- gather_reduce_forward


def _edge_fn(C, R, E, S):
    # lane-wise; mixes width-F and width-1 operands and a shared row; tanh keeps values O(1)
    return jnp.tanh(C[0] * R[0]) + E[0] * C[1] + S[0]


def _operands(rng, fwd, width, dtype, num_edges):
    n = fwd.num_rows
    return ((_rand(rng, (n, width), dtype), _rand(rng, (n, 1), dtype)), (_rand(rng, (n, width), dtype),),
            (_rand(rng, (num_edges, width), dtype),), (_rand(rng, (1, width), dtype),))


# (reduce, width, dtype, builder, segment_slots, graph): every reduction, width, dtype and builder appears,
# split rows (small slots) and packed rows (many nodes) included.
REDUCE_CASES = [
    ("sum", 1, jnp.float32, "numpy", None, {}),
    ("mean", 7, jnp.bfloat16, "jax", 4, {}),
    ("max", 41, jnp.float16, "numpy", 4, {}),
    ("min", 602, jnp.float32, "jax", None, dict(num_nodes=6, num_edges=10, hub=12, dups=2, pads=3, isolated=2)),
    ("sum", 7, jnp.float64, "jax", 8, {}),
    ("max", 7, jnp.float32, "numpy", 64, dict(num_nodes=2500, num_edges=900, hub=300)),
    ("min", 1, jnp.bfloat16, "jax", 16, dict(num_nodes=9000, num_edges=700, hub=90)),
    ("mean", 41, jnp.float64, "numpy", 8, {}),
    ("sum", 602, jnp.bfloat16, "numpy", 8, dict(num_nodes=6, num_edges=10, hub=40, dups=2, pads=3, isolated=2)),
]


@pytest.mark.parametrize("empty", ["zero", "identity"])
@pytest.mark.parametrize("reduce,width,dtype,builder,slots,graph", REDUCE_CASES)
def test_gather_reduce_forward_matches_reference(reduce, width, dtype, builder, slots, graph, empty):
    rng = np.random.default_rng(31 * width + len(reduce))
    with jax.enable_x64(dtype == jnp.float64):
        _, _, valid, fwd, _ = make_graph(rng, builder=builder, segment_slots=slots, **graph)
        ops = _operands(rng, fwd, width, dtype, len(valid))
        out = pk.gather_reduce_forward(_edge_fn, *ops, fwd, reduce=reduce, empty=empty, interpret=True)
        want = pk.gather_reduce_forward_reference(_edge_fn, *ops, fwd, reduce=reduce, empty=empty)
        assert out.dtype == dtype and out.shape == (fwd.num_rows, width)
        deg = np.diff(np.asarray(fwd.indptr))
        filled = np.asarray(out.astype(jnp.float32))[deg == 0]
        fill = 0.0 if empty == "zero" or reduce in ("sum", "mean") else (-np.inf if reduce == "max" else np.inf)
        assert (deg == 0).any() and np.all(filled == fill)
        _finite(out[deg > 0])
        _close(out, want, TOL[dtype])


def test_gather_reduce_reference_is_segment_ops_over_the_edge_list():
    """The reference's CSR reading equals jax.ops over raw edges: receivers outside [0, N) dropped (negative
    included), senders clamped, padding edges dropped."""
    rng = np.random.default_rng(1)
    n, e = 12, 90
    s = rng.integers(-3, n + 3, e)
    r = rng.integers(-2, n + 2, e)
    valid = rng.random(e) > 0.1
    x, w = _rand(rng, (n, 5), jnp.float32), _rand(rng, (e, 5), jnp.float32)
    fn = lambda C, R, E, S: C[0] * E[0] + R[0]
    xs, xr = x[np.clip(s, 0, n - 1)], x[np.clip(r, 0, n - 1)]
    msgs = xs * w + xr
    seg = np.where(valid, r, -1)
    for build in (pk.build_csr_numpy, pk.build_csr_jax):
        fwd, _ = build(s, r, n, valid, segment_slots=4)
        for reduce, op in (("sum", jax.ops.segment_sum), ("max", jax.ops.segment_max)):
            want = op(msgs, seg, num_segments=n)
            got = pk.gather_reduce_forward_reference(fn, (x,), (x,), (w,), (), fwd, reduce=reduce, empty="identity")
            _close(got, want, TOL[jnp.float32])
            kern = pk.gather_reduce_forward(fn, (x,), (x,), (w,), (), fwd, reduce=reduce, empty="identity",
                                            interpret=True)
            _close(kern, want, TOL[jnp.float32])


def _nan_graph():
    """Rows 0..4 over 9 edges; row 3 holds a NaN, row 4 +inf and -inf, row 5 is empty."""
    r = np.array([0, 0, 1, 2, 2, 3, 3, 4, 4])
    vals = np.array([1.0, 2.0, -1.0, np.inf, -3.0, np.nan, 5.0, -np.inf, np.inf], np.float32)[:, None]
    return r, jnp.asarray(vals)


@pytest.mark.parametrize("reduce", ["max", "min", "sum", "mean"])
def test_gather_reduce_propagates_nan_and_inf(reduce):
    r, vals = _nan_graph()
    fwd, _ = pk.build_csr_numpy(np.zeros_like(r), r, 6, segment_slots=1)  # every edge its own piece
    fn = lambda C, R, E, S: E[0]
    out = np.asarray(pk.gather_reduce_forward(fn, (), (), (vals,), (), fwd, reduce=reduce, interpret=True))[:, 0]
    ops = {"max": np.max, "min": np.min, "sum": np.sum, "mean": np.mean}
    want = [ops[reduce](np.asarray(vals)[r == row, 0]) for row in range(5)] + [0.0]
    np.testing.assert_array_equal(out, np.asarray(want, np.float32))  # NaN == NaN here


def test_gather_reduce_integers_are_exact():
    big = 2**24 + 1  # float32 would round it
    s = np.array([0, 1, 2, 3])
    r = np.array([0, 0, 1, 1])
    fwd, _ = pk.build_csr_numpy(s, r, 3)
    x = jnp.asarray([[big], [1], [-7], [-5]], jnp.int32)
    fn = lambda C, R, E, S: C[0] * 2
    out_sum = pk.gather_reduce_forward(fn, (x,), (), (), (), fwd, reduce="sum", interpret=True)
    out_max = pk.gather_reduce_forward(fn, (x,), (), (), (), fwd, reduce="max", empty="identity", interpret=True)
    assert out_sum.dtype == jnp.int32
    np.testing.assert_array_equal(out_sum[:, 0], [2 * big + 2, -24, 0])
    np.testing.assert_array_equal(out_max[:, 0], [2 * big, -10, np.iinfo(np.int32).min])
    comp = pk.gather_compute_forward(fn, (x,), (), (), (), fwd, num_edges=4, interpret=True)
    np.testing.assert_array_equal(comp[:, 0], [2 * big, 2, -14, -10])


@pytest.mark.parametrize("what,call", [
    ("mean", lambda fwd, x: pk.gather_reduce_forward(lambda C, R, E, S: C[0], (x,), (), (), (), fwd,
                                                     reduce="mean")),
    ("float", lambda fwd, x: pk.gather_reduce_forward(lambda C, R, E, S: C[0] * 0.5, (x,), (), (), (), fwd,
                                                      reduce="sum")),
    ("unsigned", lambda fwd, x: pk.gather_reduce_forward(lambda C, R, E, S: C[0], (x.astype(jnp.uint32),), (),
                                                         (), (), fwd, reduce="max")),
    ("complex", lambda fwd, x: pk.gather_compute_forward(lambda C, R, E, S: C[0], (x.astype(jnp.complex64),),
                                                         (), (), (), fwd, num_edges=4)),
])
def test_unsupported_dtypes_raise_type_errors(what, call):
    fwd, _ = pk.build_csr_numpy(np.array([0, 1, 2, 3]), np.array([0, 0, 1, 1]), 4)
    with pytest.raises(TypeError, match={"float": "float32 on integer", "unsigned": "uint32"}.get(what, what)):
        call(fwd, jnp.ones((4, 3), jnp.int32))


def test_bad_arguments_name_the_problem():
    fwd, _ = pk.build_csr_numpy(np.array([0, 1]), np.array([1, 0]), 2)
    x = jnp.ones((2, 4))
    fn = lambda C, R, E, S: C[0]
    with pytest.raises(ValueError, match="reduce must be one of"):
        pk.gather_reduce_forward(fn, (x,), (), (), (), fwd, reduce="prod")
    with pytest.raises(ValueError, match="empty must be one of"):
        pk.gather_reduce_forward(fn, (x,), (), (), (), fwd, reduce="max", empty="nan")
    with pytest.raises(ValueError, match="must be 1 or 4"):
        pk.gather_reduce_forward(fn, (x, jnp.ones((2, 3))), (), (), (), fwd, reduce="sum")
    with pytest.raises(ValueError, match="shared operands must have one row"):
        pk.gather_reduce_forward(fn, (x,), (), (), (x,), fwd, reduce="sum")


def test_mixed_dtypes_and_a_bfloat16_literal_in_edge_fn():
    rng = np.random.default_rng(3)
    _, _, valid, fwd, _ = make_graph(rng, segment_slots=16)
    n = fwd.num_rows
    x, a = _rand(rng, (n, 7), jnp.bfloat16), _rand(rng, (n, 1), jnp.float16)
    w = _rand(rng, (1, 7), jnp.float32)

    def fn(C, R, E, S):
        y = jnp.where(C[0] >= jnp.bfloat16(0.25), C[0] * jnp.bfloat16(1.5), C[1])
        return jnp.maximum(y, jnp.float16(-1)) * S[0]

    out = pk.gather_reduce_forward(fn, (x, a), (), (), (w,), fwd, reduce="max", interpret=True)
    assert out.dtype == jnp.float32
    _close(out, pk.gather_reduce_forward_reference(fn, (x, a), (), (), (w,), fwd, reduce="max"), TOL[jnp.float32])


def test_float64_accumulates_in_float64():
    rng = np.random.default_rng(4)
    with jax.enable_x64(True):
        _, _, _, fwd, _ = make_graph(rng, hub=400, segment_slots=32)
        x = jnp.asarray(1.0 + rng.random((fwd.num_rows, 3)) * 1e-9, jnp.float64)
        fn = lambda C, R, E, S: C[0]
        out = pk.gather_reduce_forward(fn, (x,), (), (), (), fwd, reduce="sum", interpret=True)
        want = np.zeros((fwd.num_rows, 3))
        np.add.at(want, np.repeat(np.arange(fwd.num_rows), np.diff(np.asarray(fwd.indptr))),
                  np.asarray(x)[np.asarray(fwd.col[:int(fwd.indptr[-1])])])
        assert out.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-13)


def test_no_edges_gives_empty_rows_without_a_kernel():
    fwd, rev = pk.build_csr_numpy(np.zeros(0, int), np.zeros(0, int), 3)
    x = jnp.ones((3, 2))
    fn = lambda C, R, E, S: C[0]
    out = pk.gather_reduce_forward(fn, (x,), (), (), (), fwd, reduce="max", empty="identity", interpret=True)
    np.testing.assert_array_equal(out, np.full((3, 2), -np.inf))
    out = pk.gather_compute_forward(fn, (x,), (), (), (), fwd, num_edges=0, interpret=True)
    assert out.shape == (0, 2)


# ---------------------------------------------------------------------------------- gather_compute_forward


@pytest.mark.parametrize("width,dtype,builder,slots", [(7, jnp.float32, "jax", 4), (41, jnp.bfloat16, "numpy", None),
                                                       (1, jnp.float16, "numpy", 8)])
def test_gather_compute_forward_matches_reference(width, dtype, builder, slots):
    rng = np.random.default_rng(width)
    _, _, valid, fwd, _ = make_graph(rng, builder=builder, segment_slots=slots)
    ops = _operands(rng, fwd, width, dtype, len(valid))
    out = pk.gather_compute_forward(_edge_fn, *ops, fwd, num_edges=len(valid), interpret=True)
    _finite(out)
    _close(out, pk.gather_compute_forward_reference(_edge_fn, *ops, fwd, num_edges=len(valid)), TOL[dtype])
    assert np.all(np.asarray(out.astype(jnp.float32))[~valid] == 0.0), "padding edges must give 0"
