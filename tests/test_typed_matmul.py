"""The ``typed_matmul`` primitive: every implementation against the per-row reference, forward, ``grad`` and
``jvp``, including non-finite weights of types a row does not have, out-of-range types and empty inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jgnn.ops import typed_matmul as tm
from tests.checks import check_against_reference, x64


def reference(x, table, types):
    """What ``x @ W[types]`` means in plain jnp: each row times its own (clamped) type's matrix."""
    w = table[jnp.clip(types, 0, table.shape[0] - 1)]
    return jnp.einsum("r...i,r...io->r...o", x, w, preferred_element_type=jnp.result_type(x, table)).astype(
        jnp.result_type(x, table))


def case(rng, rows, groups, d_in, d_out, heads=(), dtype=jnp.float32):
    x = jnp.asarray(rng.normal(size=(rows, *heads, d_in)), dtype)
    table = jnp.asarray(rng.normal(size=(groups, *heads, d_in, d_out)), dtype)
    types = jnp.asarray(rng.integers(0, groups, size=rows), jnp.int32)
    return x, table, types


IMPLS = ("sorted_blocks", "reference")


# Few types rank rows by a running count, many by a sort (`COUNTING_TYPES`): both paths.
GROUPS = [4, tm.COUNTING_TYPES + 3]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("width", [1, 7, 41])
@pytest.mark.parametrize("heads", [(), (3,)])
@pytest.mark.parametrize("groups", GROUPS)
def test_matches_reference(impl, width, heads, groups):
    rng = np.random.default_rng(width * 10 + len(heads) + groups)
    x, table, types = case(rng, 37, groups, width, width + 2, heads)
    check_against_reference(lambda x, w: tm.typed_matmul(x, w, types, impl=impl, block=8),
                            lambda x, w: reference(x, w, types), x, table, terms=width + 2)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("groups", GROUPS)
def test_other_types_weights_never_reach_a_row(impl, groups):
    """A NaN/inf matrix of a type only some rows have stays out of the others, values and both derivatives."""
    rng = np.random.default_rng(groups)
    x, table, types = case(rng, 40, groups, 5, 4)
    table = table.at[2, 0, 0].set(jnp.nan).at[1, 1, 1].set(jnp.inf)
    x = x.at[3, 2].set(jnp.inf)
    types = types.at[:6].set(0)
    check_against_reference(lambda x, w: tm.typed_matmul(x, w, types, impl=impl, block=4),
                            lambda x, w: reference(x, w, types), x, table)


@pytest.mark.parametrize("impl", ["sorted_blocks"])
def test_types_out_of_range_are_clamped(impl):
    rng = np.random.default_rng(2)
    x, table, _ = case(rng, 9, 3, 4, 2)
    types = jnp.asarray([-4, 0, 1, 2, 3, 99, 1, 0, -1], jnp.int32)
    check_against_reference(lambda x, w: tm.typed_matmul(x, w, types, impl=impl, block=4),
                            lambda x, w: reference(x, w, types), x, table)


@pytest.mark.parametrize("impl", ["sorted_blocks", "pallas_interpret"])  # an empty graph's typed messages
def test_no_rows(impl):
    x, table, types = case(np.random.default_rng(3), 0, 3, 4, 2)
    check_against_reference(lambda x, w: tm.typed_matmul(x, w, types, impl=impl, block=4),
                            lambda x, w: reference(x, w, types), x, table)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision(dtype):
    x, table, types = case(np.random.default_rng(4), 30, 3, 41, 7, dtype=dtype)
    op = lambda x, w: tm.typed_matmul(x, w, types, impl="sorted_blocks", block=8)
    # Values and grad against float32: the reference's bf16 scatter-add of per-row outer products rounds at every
    # term. The tangent against the reference itself: x·dW + dx·W rounds each product to the dtype first.
    wide = lambda x, w: reference(x.astype(jnp.float32), w.astype(jnp.float32), types).astype(dtype)
    check_against_reference(op, wide, x, table, dtype=dtype, jvp=False)
    check_against_reference(op, lambda x, w: reference(x, w, types), x, table, dtype=dtype, grad=False)


# pallas_interpret: jax.lax.ragged_dot accumulated float64 in float32 (fuzz campaign 20261124, 700 cases).
@pytest.mark.parametrize("impl", ["sorted_blocks", "pallas_interpret"])
def test_float64(impl):
    with x64():
        x, table, types = case(np.random.default_rng(5), 30, 3, 602, 7, dtype=jnp.float64)
        check_against_reference(lambda x, w: tm.typed_matmul(x, w, types, impl=impl, block=8),
                                lambda x, w: reference(x, w, types), x, table)


@pytest.mark.parametrize("axes", [(None, 0), (0, None), (0, 0)])
def test_pallas_under_vmap(axes):
    """jax.lax.ragged_dot has no batching rule: vmapped over stacked weights or rows, the Pallas backends crashed
    (fuzz campaign 20261124, 15 cases)."""
    rng = np.random.default_rng(6)
    x, table, types = case(rng, 21, 3, 5, 4)
    stack = lambda a: jnp.stack([a, 2.0 * a[::-1]])
    args = [stack(a) if ax == 0 else a for a, ax in zip((x, table), axes, strict=True)]
    batched = lambda f: jax.vmap(f, in_axes=axes)
    check_against_reference(batched(lambda x, w: tm.typed_matmul(x, w, types, impl="pallas_interpret")),
                            batched(lambda x, w: reference(x, w, types)), *args, terms=5)


@pytest.mark.parametrize("impl", ["static_groups", "pallas_interpret"])
@pytest.mark.parametrize("heads", [(), (3,)])
@pytest.mark.parametrize("block", [4, 128])
def test_static_groups_match_reference(impl, heads, block):
    """Rows in static runs of one type (a layout's typed pairs), including a type the table clamps and a type in
    two runs: XLA's GEMM per run, or the kernel with one group per run (per-head tables: the GEMMs)."""
    rng = np.random.default_rng(7)
    x, table, _ = case(rng, 13, 3, 7, 5, heads)
    groups = ((0, 0, 4), (2, 4, 5), (5, 5, 11), (0, 11, 13))  # type 5 is out of range: clamped to the last
    types = jnp.asarray([0] * 4 + [2] + [5] * 6 + [0] * 2, jnp.int32)
    check_against_reference(lambda x, w: tm.typed_matmul(x, w, types, impl=impl, groups=groups, block=block),
                            lambda x, w: reference(x, w, types), x, table, terms=7)


def _runs(rng, longest: int):
    """More runs than `FEW_GROUPS`, one per type, of 1 to ``longest - 1`` rows: (groups, types)."""
    sizes = rng.integers(1, longest, size=tm.FEW_GROUPS + 4)
    ends = np.cumsum(sizes)
    groups = tuple((t, int(e - n), int(e)) for t, (n, e) in enumerate(zip(sizes, ends, strict=True)))
    return groups, jnp.asarray(np.repeat(np.arange(len(groups)), sizes), jnp.int32)


@pytest.mark.parametrize("impl", ["static_groups", "pallas_interpret"])
def test_many_static_groups_match_reference(impl):
    """More runs than `FEW_GROUPS`: the blocked GEMM with host-computed slots, or the kernel's groups."""
    rng = np.random.default_rng(9)
    groups, types = _runs(rng, 6)
    x, table, _ = case(rng, types.shape[0], len(groups), 7, 5)
    check_against_reference(lambda x, w: tm.typed_matmul(x, w, types, impl=impl, groups=groups, block=4),
                            lambda x, w: reference(x, w, types), x, table, terms=7)


def test_static_runs_on_the_kernel_lower_for_cuda_without_a_sort_or_a_loop():
    """The kernel's tile bookkeeping for static runs is computed on the host: the CUDA module (the op, its JVP
    and its gradient) has no sort and no while loop outside the kernels. Sorting per call and ``searchsorted``'s
    loop cost RGCN on AIFB 2.9x its XLA time on an H100 (benchmarks/results/gpu-h100-2026-11-27.md)."""
    from pallas_kernels import compat as pk_compat

    rng = np.random.default_rng(10)
    groups, types = _runs(rng, 40)
    x, table, _ = case(rng, types.shape[0], len(groups), 16, 16)
    f = lambda x, w: jnp.sum(jnp.sin(tm.typed_matmul(x, w, types, impl="pallas", groups=groups)))
    text = pk_compat.export_cuda_mlir(jax.value_and_grad(f, argnums=(0, 1)), x, table)
    assert pk_compat.TRITON_CUSTOM_CALL in text  # the kernels' own loops are serialized inside these calls
    assert "stablehlo.sort" not in text and "stablehlo.while" not in text


def test_static_groups_must_cover_the_rows():
    x, table, types = case(np.random.default_rng(8), 6, 2, 3, 2)
    with pytest.raises(ValueError, match="do not cover"):
        tm.typed_matmul(x, table, types, impl="static_groups", groups=((0, 0, 4),))


# ---- static node-type runs from a GraphLayout (HGT's K, Q, V and A-linear) ---------------------------------------

def _typed_graph(rng, n=30, e=200, node_types=3, edge_types=4, d=8, sort=True):
    import jraph

    types = rng.integers(0, node_types, n).astype(np.int32)
    return jraph.GraphsTuple(
        nodes={"h": jnp.asarray(rng.normal(size=(n, d)), jnp.float32), "type": jnp.asarray(np.sort(types) if sort
                                                                                          else types)},
        edges={"type": jnp.asarray(rng.integers(0, edge_types, e), jnp.int32)},
        senders=jnp.asarray(rng.integers(0, n, e), jnp.int32), receivers=jnp.asarray(rng.integers(0, n, e), jnp.int32),
        n_node=jnp.array([n]), n_edge=jnp.array([e]), globals=None)


def _typed_matmul_impls(fn, *args) -> list[str]:
    """The ``impl`` of every typed matmul in ``fn``'s jaxpr, nested jaxprs included."""
    import jax

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive is tm.typed_matmul_p:
                yield eqn.params["impl"]
            for p in eqn.params.values():
                sub = getattr(p, "jaxpr", p)
                if hasattr(sub, "eqns"):
                    yield from walk(sub)
    return list(walk(jax.make_jaxpr(fn)(*args).jaxpr))


@pytest.mark.parametrize("sort,isolated", [(True, False), (False, False), (True, True)])
def test_hgt_node_types_sorted_in_the_layout_run_as_static_slices(sort, isolated):
    """Nodes sorted by type: the layout's runs make node-typed matmuls one GEMM per type (no sort in the
    program), and the (source, edge type) pairs are sorted by type anyway, so every typed matmul is static
    slices. Unsorted: the node-typed ones run as sorted blocks. With an isolated node the layout does not cover
    every row, so the per-node tables read node types masked at the rows no edge reads (broadcast_reorder,
    issue 12), which are not the layout's runs: some typed matmuls stay sorted blocks (a known cost). Forward
    and ``grad`` equal the reference backend's."""
    import jax

    import jgnn.nn as jnn
    from jgnn.layout import GraphLayout

    rng = np.random.default_rng(31)
    g = _typed_graph(rng, sort=sort)
    if isolated:  # no edge touches the last node
        n = g.nodes["h"].shape[0]
        g = g._replace(senders=jnp.minimum(g.senders, n - 2), receivers=jnp.minimum(g.receivers, n - 2))
    layout = GraphLayout.from_graph(g)
    assert bool(layout.node_groups) == sort
    assert layout.every_node_sends == layout.every_node_receives == (not isolated)
    conv, ref = jnn.HGTConv(8, 2, 3, 4), jnn.HGTConv(8, 2, 3, 4, backend="reference")
    params = conv.init(jax.random.key(0), g)
    impls = set(_typed_matmul_impls(lambda p: conv.apply(p, g, layout=layout).nodes["h"], params))
    assert impls == ({"static_groups"} if sort and not isolated else {"sorted_blocks", "static_groups"})
    check_against_reference(
        lambda h: conv.apply(params, g._replace(nodes={**g.nodes, "h": h}), layout=layout).nodes["h"],
        lambda h: ref.apply(params, g._replace(nodes={**g.nodes, "h": h})).nodes["h"], g.nodes["h"])


def test_layout_rejects_other_node_types():
    import jax

    import jgnn
    import jgnn.nn as jnn
    from jgnn.layout import GraphLayout

    rng = np.random.default_rng(32)
    g = _typed_graph(rng)
    layout = GraphLayout.from_graph(g)
    other = g._replace(nodes={**g.nodes, "type": g.nodes["type"][::-1]})
    conv = jnn.HGTConv(8, 2, 3, 4)
    params = conv.init(jax.random.key(0), g)
    with pytest.raises(jgnn.LayoutMismatchError):
        conv.apply(params, other, layout=layout)


@pytest.mark.parametrize("groups", [3, tm.COUNTING_TYPES + 3])
def test_pallas_kernel_in_every_derivative_order(groups):
    """On the Pallas backends the op runs the Triton kernel, whose custom VJP forward mode cannot enter: the op's
    own JVP (bilinear) and transpose rules keep ``jvp``, ``grad`` and the Hessian-vector product (forward over
    reverse) working, and equal to the reference's."""
    rng = np.random.default_rng(groups)
    x, table, types = case(rng, 29, groups, 8, 16)
    run = lambda x, w: tm.typed_matmul(x, w, types, impl="pallas_interpret")
    check_against_reference(run, lambda x, w: reference(x, w, types), x, table, terms=16)
    loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))
    tx, tw = (jnp.asarray(rng.normal(size=a.shape), jnp.float32) for a in (x, table))
    hvp = lambda f: jax.jvp(jax.grad(loss(f), argnums=(0, 1)), (x, table), (tx, tw))[1]
    for got, want in zip(hvp(run), hvp(lambda x, w: reference(x, w, types)), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype,heads,code", [
    ("float32", (), "typed_matmul_kernel"), ("float64", (), "typed_matmul_ragged_dot"),
    ("float32", (2,), "typed_matmul_per_head"), ("complex64", (), "typed_matmul_xla_dtype")])
def test_explain_names_the_engine_the_pallas_backend_runs(dtype, heads, code):
    """On a Pallas backend the report's typed-matmul record names the engine that runs (`tm.pallas_engine`,
    which the lowering itself asks): the Triton kernel for 32-bit floats, ragged_dot for float64, XLA's per-row
    products for per-head tables, XLA's blocked GEMMs for complex64 (JAX segfaulted serialising ragged_dot of
    complex64 for CUDA). The layer's result is the reference backend's."""
    from graph_cases import random_graph

    import jgnn
    from jgnn.report import Reason

    with x64():
        rng = np.random.default_rng(41)
        graph = random_graph(rng, 12, 40, 6 * int(np.prod(heads)), edge_types=3, dtype=jnp.dtype(dtype))
        w = jnp.asarray(rng.normal(size=(3, *heads, 6, 5)), dtype)

        def phi(s, d, e):
            return jnp.einsum("...i,...io->...o", s["h"].reshape(*heads, 6), w[e["type"]]).reshape(-1)

        def rho(mb, node):
            return jgnn.sum(mb)

        layer, ref = (jgnn.message_passing(phi, rho, lambda n, agg: {"h": agg}, backend=b)
                      for b in ("pallas_interpret", "reference"))
        records = [k for k in jgnn.explain(layer, graph).kernels if k.op == "typed_matmul"]
        assert [(k.lowering, k.code) for k in records] == [(tm.pallas_engine(jnp.zeros((1, *heads, 6), dtype), w),
                                                            Reason(code))]
        engines = {"typed_matmul_kernel": "triton_kernel", "typed_matmul_ragged_dot": "ragged_dot",
                   "typed_matmul_per_head": "reference", "typed_matmul_xla_dtype": "xla_blocks"}
        assert records[0].lowering == engines[code]
        np.testing.assert_allclose(layer(graph).nodes["h"], ref(graph).nodes["h"], rtol=1e-5, atol=1e-5)
