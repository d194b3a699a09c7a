"""Optimizer passes: each rewrite against the reference (forward and gradients), FLOPs, and legality skips."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import pytest
from checks import check_against_reference, x64
from graph_cases import pad, random_graph, real_nodes
from models import make_edgeconv, make_gat, make_gcn, make_hgt, make_rgcn

import jgnn
from jgnn.report import Pass, Reason

TOL = dict(rtol=1e-5, atol=1e-5)


def _rng(seed: int = 0):
    return np.random.default_rng(seed)


def _pair(parts):
    phi, rho, psi = parts[:3]
    return (jgnn.message_passing(phi, rho, psi, backend="xla"),
            jgnn.message_passing(phi, rho, psi, backend="reference"))


def _check_forward_and_grad(compiled, reference, graph, mask=None):
    def loss(h, layer):
        out = layer(graph._replace(nodes={**graph.nodes, "h": h})).nodes["h"]
        out = out if mask is None else out[mask]
        return jnp.sum(jnp.sin(out))

    h = graph.nodes["h"]
    out_c = jax.jit(lambda g: compiled(g).nodes["h"])(graph)
    out_r = reference(graph).nodes["h"]
    if mask is not None:
        out_c, out_r = out_c[mask], out_r[mask]
    np.testing.assert_allclose(out_c, out_r, **TOL)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: loss(x, compiled)))(h),
                               jax.grad(lambda x: loss(x, reference))(h), **TOL)


def _flops(fn, *args):
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return cost["flops"]


def test_naive_gat_flops_drop_at_least_4x():
    rng = _rng()
    n = 128
    graph = random_graph(rng, n, 16 * n, 64)
    compiled, reference = _pair(make_gat(rng, 64, heads=1, d_head=64, naive=True))
    f_ref = _flops(lambda g: reference(g).nodes["h"], graph)
    f_jgnn = _flops(lambda g: compiled(g).nodes["h"], graph)
    assert f_ref / f_jgnn >= 4.0, (f_ref, f_jgnn)
    kinds = {d.by for d in jgnn.explain(compiled, graph).applied_rewrites}
    assert {Pass.BROADCAST_REORDER, Pass.LINEAR_SPLIT} <= kinds


@pytest.mark.parametrize("model", ["gat", "gat_naive", "gcn", "rgcn", "hgt"])
@pytest.mark.parametrize("d", [7, 41])
def test_rewritten_models_match_reference(model, d):
    rng = _rng()
    graph = random_graph(rng, 17, 60, d, node_types=2, edge_types=3, isolated=3, duplicates=3)
    graph = graph._replace(nodes={**graph.nodes, "c": jnp.asarray(rng.uniform(0.2, 1, 17), jnp.float32)})
    parts = {"gat": lambda: make_gat(rng, d), "gat_naive": lambda: make_gat(rng, d, naive=True),
             "gcn": lambda: make_gcn(rng, d), "rgcn": lambda: make_rgcn(rng, d),
             "hgt": lambda: make_hgt(rng, d)}[model]()
    _check_forward_and_grad(*_pair(parts), graph)


def test_rewrites_on_padded_graph():
    rng = _rng()
    graph = pad(random_graph(rng, 15, 50, 7, isolated=2))
    _check_forward_and_grad(*_pair(make_gat(rng, 7, naive=True)), graph, mask=real_nodes(graph))


def test_fewer_nodes_than_edges_is_required_for_lifting():
    rng = _rng()
    graph = random_graph(rng, 40, 20, 16, isolated=20)  # N > E: lifting would do more work
    compiled, reference = _pair(make_gat(rng, 16, heads=1, d_head=16))
    report = jgnn.explain(compiled, graph)
    lifted = [d.get("op") for d in report.applied_rewrites if d.by == Pass.BROADCAST_REORDER]
    assert "dot_general" not in lifted
    kept = [d for d in report.decisions if d.code == Reason.COST_KEEPS_EDGES]
    assert kept and all(d.get("before") <= d.get("after") for d in kept)
    _check_forward_and_grad(compiled, reference, graph)


def _plain(rng, n=16, e=60, d=8):
    g = random_graph(rng, n, e, d)
    return g._replace(nodes=g.nodes["h"])


def test_skip_when_operands_come_through_different_indices():
    rng = _rng()
    graph = _plain(rng)
    W = jnp.asarray(rng.normal(size=(8, 8)), jnp.float32)

    def model(g):
        m = jnp.tanh((g.nodes[g.senders] * g.nodes[g.receivers]) @ W)  # src*dst: cannot move to one side
        return g._replace(nodes=jax.ops.segment_sum(m, g.receivers, g.nodes.shape[0]))

    compiled = jgnn.compile(model, backend="xla")
    np.testing.assert_allclose(compiled(graph).nodes, model(graph).nodes, **TOL)
    assert Reason.DIFFERENT_INDICES in jgnn.explain(compiled, graph).codes(Pass.BROADCAST_REORDER, applied=False)


def test_skip_when_op_is_not_rowwise():
    rng = _rng()
    graph = _plain(rng)

    def model(g):
        x = g.nodes[g.senders]
        m = jnp.cumsum(x, axis=0)  # mixes edge rows: must not be lifted to the nodes
        return g._replace(nodes=jax.ops.segment_sum(m, g.receivers, g.nodes.shape[0]))

    compiled = jgnn.compile(model, backend="xla")
    np.testing.assert_allclose(compiled(graph).nodes, model(graph).nodes, **TOL)
    report = jgnn.explain(compiled, graph)
    assert [(f.code, f.primitive) for f in report.fallbacks] == [(Reason.MIXES_ROWS, "cumsum")]
    assert Reason.LIFTED not in report.codes(Pass.BROADCAST_REORDER)


@jax.custom_vjp
def _tanh_with_own_grad(x):
    return jnp.tanh(x)


_tanh_with_own_grad.defvjp(lambda x: (jnp.tanh(x), x), lambda x, g: (3.0 * g * x,))


@pytest.mark.parametrize("act", ["relu", "custom_vjp"])
def test_custom_jvp_moves_to_nodes_and_custom_vjp_stays_on_edges(act):
    """relu (a custom_jvp) is traced again at node rows, so ``relu(h[src]) -> relu(h)[src]``; a custom_vjp's
    backward checks its traced shapes, so it stays on the edges, said why. Both equal the reference, gradient
    included (the custom rules run: relu's at 0, the custom_vjp's deliberately different backward)."""
    rng = _rng()
    graph = _plain(rng)
    graph = graph._replace(nodes=graph.nodes.at[:4].set(0.0))  # relu's kink
    W = jnp.asarray(rng.normal(size=(8, 8)), jnp.float32)
    fn = {"relu": jax.nn.relu, "custom_vjp": _tanh_with_own_grad}[act]

    def model(g):
        m = fn(g.nodes[g.senders]) @ W
        return g._replace(nodes=jax.ops.segment_sum(m, g.receivers, g.nodes.shape[0]))

    compiled = jgnn.compile(model, backend="xla")
    np.testing.assert_allclose(compiled(graph).nodes, model(graph).nodes, **TOL)
    grads = [jax.grad(lambda h, f=f: jnp.sum(f(graph._replace(nodes=h)).nodes ** 2))(graph.nodes)
             for f in (compiled, model)]
    np.testing.assert_allclose(*grads, **TOL)
    report = jgnn.explain(compiled, graph)
    lifted = {d.get("op") for d in report.decisions if d.code == Reason.LIFTED}
    fixed = {d.get("primitive") for d in report.decisions if d.code == Reason.FIXED_SHAPE_BODY}
    if act == "relu":
        assert "custom_jvp_call" in lifted and not fixed
    else:
        assert fixed == {"custom_vjp_call"} and "custom_vjp_call" not in lifted


@pytest.mark.parametrize("name", ["GraphConvolution", "GAT", "GraphNetwork", "GraphNetwork+attention",
                                  "InteractionNetwork"])
def test_jraph_models_are_rewritten_and_equal(name):
    from test_core import _jraph_models, _plain_graph

    rng = _rng()
    graph = _plain_graph(rng, n=20, e=120, d=7)
    models = _jraph_models(rng, 7)
    w = jnp.asarray(rng.normal(size=(7 + 7 + 3 + 2, 3)) * 0.3, jnp.float32)
    models["GraphNetwork+attention"] = jraph.GraphNetwork(
        update_edge_fn=lambda e, s, r, g: jnp.tanh(jnp.concatenate([e, s, r, g], -1) @ w),
        update_node_fn=lambda n, s, r, g: n + jnp.sum(r, -1, keepdims=True),
        attention_logit_fn=lambda e, s, r, g: jnp.sum(e, -1),
        attention_reduce_fn=lambda e, weights: e * weights[:, None])
    model = models[name]
    compiled = jgnn.compile(model, backend="xla")
    leaves = lambda g: jax.tree_util.tree_leaves((g.nodes, g.edges, g.globals))
    for a, b in zip(leaves(jax.jit(compiled)(graph)), leaves(model(graph)), strict=True):
        np.testing.assert_allclose(a, b, **TOL)
    loss = lambda nodes, f: sum(jnp.sum(x ** 2) for x in leaves(f(graph._replace(nodes=nodes))))
    np.testing.assert_allclose(jax.grad(loss)(graph.nodes, compiled), jax.grad(loss)(graph.nodes, model), **TOL)
    report = jgnn.explain(compiled, graph)
    assert report.applied_rewrites and not report.fallbacks
    # Where the updated edges are an output, the reduction reads the stored rows in an edge op.
    assert report.codes(Pass.FUSE, applied=True)
    assert Reason.MESSAGES_STORED_ANYWAY not in report.codes(Pass.FUSE, applied=False)


def test_plans_are_cached_per_structure_and_shared_by_new_layers():
    rng = _rng()
    graph = random_graph(rng, 10, 30, 7)
    cache = jgnn.PlanCache(capacity=2)
    g = graph._replace(nodes=graph.nodes["h"])

    def make(scale):  # a new model object per call, as a Flax module makes one per apply
        w = jnp.full((7, 7), scale, jnp.float32)
        return jgnn.compiler.Compiled(jraph.GraphConvolution(lambda x: x @ w), backend="xla", cache=cache)

    first, second = make(1.0), make(2.0)
    first(g)
    second(g._replace(nodes=g.nodes + 1))  # new constants, same structure: the plan is reused
    assert (first.stats.misses, second.stats.hits, second.stats.misses, len(cache)) == (1, 1, 0, 1)
    np.testing.assert_allclose(second(g).nodes, jraph.GraphConvolution(lambda x: x @ jnp.full((7, 7), 2.0))(g).nodes,
                               **TOL)
    second(random_graph(rng, 11, 30, 7)._replace(nodes=jnp.ones((11, 7))))
    make(3.0)(random_graph(rng, 12, 30, 7)._replace(nodes=jnp.ones((12, 7))))
    assert len(cache) == 2  # bounded: the least recently used plan went
    report = jgnn.explain(second, g)
    assert (report.cache.hits, report.cache.capacity) == (second.stats.hits, 2)


def _edge_weight_tensors(fn, graph, e, weight_shapes):
    """Values in the traced program shaped [E, *w] for a per-type weight shape w: a per-edge weight copy."""
    jaxpr = jax.make_jaxpr(fn)(graph)
    found = []

    def walk(jx):
        for eqn in jx.eqns:
            found.extend((eqn.primitive.name, v.aval.shape) for v in eqn.outvars
                         if v.aval.shape[:1] == (e,) and tuple(v.aval.shape[1:]) in weight_shapes)
            for param in eqn.params.values():
                sub = getattr(param, "jaxpr", param)
                if hasattr(sub, "eqns"):
                    walk(sub)

    walk(jaxpr.jaxpr)
    return found


@pytest.mark.parametrize("model", ["rgcn", "hgt"])
@pytest.mark.parametrize("backend", ["xla", "pallas_interpret"])
def test_typed_weights_never_materialise_per_edge(model, backend, monkeypatch):
    monkeypatch.setenv("JGNN_EDGE_BLOCK_BYTES", "4096")  # the CPU lowering gathers weights one block at a time
    rng = _rng()
    e = 70
    graph = random_graph(rng, 18, e, 9, node_types=2, edge_types=3, isolated=2)
    parts = make_rgcn(rng, 9) if model == "rgcn" else make_hgt(rng, 9, heads=2, d_head=4)
    weights = {(9, 6)} if model == "rgcn" else {(9, 8), (2, 4, 4)}  # per-type W: [d_in, d_out], [H, d, d]
    layer = jgnn.message_passing(*parts[:3], backend=backend)
    reference = jgnn.message_passing(*parts[:3], backend="reference")
    assert _edge_weight_tensors(lambda g: reference(g).nodes["h"], graph, e, weights), "the reference builds them"
    assert not _edge_weight_tensors(lambda g: layer(g).nodes["h"], graph, e, weights)
    assert any(r.kind == "typed_matmul" for r in jgnn.explain(layer, graph).applied_rewrites)
    _check_forward_and_grad(layer, reference, graph)


def test_typed_matmuls_of_the_same_rows_run_as_one():
    """HGT's K, Q and V of the node features (same rows, same node types) are one typed matmul."""
    rng = _rng(3)
    graph = random_graph(rng, 18, 60, 9, node_types=2, edge_types=3, isolated=2)
    parts = make_hgt(rng, 9, heads=2, d_head=4)
    layer = jgnn.message_passing(*parts[:3], backend="xla")
    report = jgnn.explain(layer, graph)
    merged = [d for d in report.applied_rewrites if d.code == Reason.MERGED_TYPED_MATMULS]
    # K and V read source rows, Q destination rows. The graph has isolated nodes, so each end's lifted matmuls
    # read the node rows masked for the rows that end reads (issue 12: NaN there must reach no gradient of the
    # other end's weights): K and V are one typed matmul, Q runs on its own rows.
    assert [(d.get("count"), d.get("rows"), d.get("d_out")) for d in merged] == [(2, 18, 16)]
    node_level = [k for k in report.kernels if k.op == "typed_matmul" and k.get("rows") == 18]
    assert sorted(k.get("d_out") for k in node_level) == [8, 16]
    _check_forward_and_grad(layer, jgnn.message_passing(*parts[:3], backend="reference"), graph)


def test_linear_reorder_shared_and_typed():
    rng = _rng()
    graph = random_graph(rng, 30, 200, 16, edge_types=3)
    W = jnp.asarray(rng.normal(size=(3, 16, 32)) / 4, jnp.float32)
    a = jnp.asarray(rng.normal(size=(3, 32)) / 6, jnp.float32)
    W2 = jnp.asarray(rng.normal(size=(16, 32)) / 4, jnp.float32)
    a2 = jnp.asarray(rng.normal(size=(32,)) / 6, jnp.float32)

    def phi(s, d, e):  # relational attention scores, written the natural way
        t = e["type"]
        return {"score": (s["h"] @ W[t]) @ a[t] + (d["h"] @ W2) @ a2, "v": s["h"]}

    def rho(mb, node):
        return jgnn.sum(jgnn.softmax(mb["score"])[:, None] * mb["v"])

    layer = jgnn.message_passing(phi, rho, lambda n, agg: {"h": agg}, backend="xla")
    reference = jgnn.message_passing(phi, rho, lambda n, agg: {"h": agg}, backend="reference")
    targets = {d.get("to") for d in jgnn.explain(layer, graph).applied_rewrites if d.by == Pass.LINEAR_REORDER}
    assert targets == {"x @ (W @ a)[type]", "x @ (A @ B)"}
    _check_forward_and_grad(layer, reference, graph)


def test_linear_reorder_skips_when_it_costs_more():
    rng = _rng()
    graph = random_graph(rng, 30, 60, 4)
    A = jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)  # narrow middle: reassociating would cost more
    B = jnp.asarray(rng.normal(size=(2, 64)), jnp.float32)
    layer = jgnn.message_passing(lambda s, d, e: (s["h"] @ A) @ B, None, lambda n, agg: {"h": agg}, backend="xla")
    report = jgnn.explain(layer, graph)
    assert Reason.REASSOCIATION_COSTS_MORE in report.codes(Pass.LINEAR_REORDER, applied=False)
    reference = jgnn.message_passing(lambda s, d, e: (s["h"] @ A) @ B, None, lambda n, agg: {"h": agg},
                                     backend="reference")
    np.testing.assert_allclose(layer(graph).nodes["h"], reference(graph).nodes["h"], **TOL)


@pytest.mark.parametrize("kind", ["sum", "mean"])
@pytest.mark.parametrize("backend", ["xla", "pallas_interpret"])
def test_narrowing_matmul_moves_before_the_reduction(kind, backend):
    """GraphSAGE on wide features, ``mean(h[src]) @ W`` with W 41 → 7: the matmul moves before the reduction
    and then to the nodes, so the fused op reduces 7-wide edge rows, not 41-wide ones; values, grad and jvp equal
    the reference (isolated nodes and a hub, f64). W 7 → 41 keeps the reduction first."""
    rng = _rng()
    with x64():
        graph = random_graph(rng, 30, 150, 41, isolated=3, hub=20, duplicates=5, dtype=jnp.float64)
        narrow, wide = (jnp.asarray(rng.normal(size=s), jnp.float64) for s in ((41, 7), (7, 41)))

        def layer(w, backend):
            reduce = getattr(jgnn, kind)
            return jgnn.message_passing(lambda s, d, e: s["h"], lambda mb, n: reduce(mb),
                                        lambda n, agg: {"h": agg @ w}, backend=backend)

        report = jgnn.explain(layer(narrow, backend), graph)
        (moved,) = [d for d in report.decisions if d.code == Reason.MATMUL_BEFORE_REDUCTION]
        assert moved.applied and (moved.get("d_in"), moved.get("d_out")) == (41, 7)
        assert [d.get("shape") for d in report.decisions if d.code == Reason.FUSED_REDUCE] == [[150, 7]]
        nodes = lambda b: (lambda g: layer(narrow, b)(g).nodes)
        check_against_reference(nodes(backend), nodes("reference"), graph, dtype=jnp.float64)
        graph7 = graph._replace(nodes={"h": graph.nodes["h"][:, :7]})
        report = jgnn.explain(layer(wide, backend), graph7)
        assert Reason.MATMUL_DOES_NOT_NARROW in report.codes(Pass.LINEAR_REORDER, applied=False)
        assert Reason.MATMUL_BEFORE_REDUCTION not in report.codes(Pass.LINEAR_REORDER)


def test_traced_scalar_constants_under_grad():
    """A trainable scalar closed over by psi (GIN's eps) is a traced constant: CSE must not inspect it."""
    rng = _rng()
    graph = random_graph(rng, 10, 30, 4)

    def f(eps, backend):
        layer = jgnn.message_passing(lambda s, d, e: s["h"], psi=lambda n, a: {"h": (1 + eps) * n["h"] + a},
                                     backend=backend)
        return jnp.sum(layer(graph).nodes["h"] ** 2)

    np.testing.assert_allclose(jax.grad(f)(0.1, "xla"), jax.grad(f)(0.1, "reference"), rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True])
def test_compact_materialize_per_source_and_edge_type(padded):
    from jgnn.layout import GraphLayout

    rng = _rng()
    graph = random_graph(rng, 20, 200, 7, edge_types=3, isolated=2)
    graph = pad(graph) if padded else graph
    layout = GraphLayout.from_graph(graph, padded=padded)
    parts = make_rgcn(rng, 7)
    layer = jgnn.message_passing(*parts, backend="xla")
    reference = jgnn.message_passing(*parts, backend="reference")
    report = jgnn.explain(layer, graph, layout=layout)
    applied = [d for d in report.applied_rewrites if d.code == Reason.COMPACTED_PAIRS]
    assert applied and applied[0].get("pairs") < applied[0].get("edges")
    # The layout's pairs come in static runs of one type: one GEMM per run, no sort in the program.
    per_pair = [k for k in report.kernels if k.op == "typed_matmul" and k.get("rows") == applied[0].get("pairs")]
    assert [k.lowering for k in per_pair] == ["static_groups"]
    mask = real_nodes(graph) if padded else slice(None)
    np.testing.assert_allclose(layer(graph, layout=layout).nodes["h"][mask], reference(graph).nodes["h"][mask], **TOL)

    def loss(h, f, **kw):
        return jnp.sum(jnp.sin(f(graph._replace(nodes={**graph.nodes, "h": h}), **kw).nodes["h"][mask]))

    np.testing.assert_allclose(jax.grad(loss)(graph.nodes["h"], layer, layout=layout),
                               jax.grad(loss)(graph.nodes["h"], reference), **TOL)


@pytest.mark.parametrize("reduce, ties, padded, backend", [
    ("max", False, False, "xla"), ("min", False, True, "xla"), ("max", True, False, "xla"),
    ("max", False, False, "pallas_interpret")])
def test_max_min_aggregation_is_fused_and_splits_ties_as_the_reference(reduce, ties, padded, backend):
    rng = _rng()
    graph = random_graph(rng, 20, 160, 41 if ties else 7, isolated=3, duplicates=6)
    graph = pad(graph) if padded else graph
    parts = make_edgeconv(rng, graph.nodes["h"].shape[1], reduce=reduce, ties=ties)
    layer = jgnn.message_passing(*parts, backend=backend)
    reference = jgnn.message_passing(*parts, backend="reference")
    report = jgnn.explain(layer, graph)
    assert f"gather_reduce({reduce})" in {k.op for k in report.kernels}
    if not ties:  # concat(x_i, x_j - x_i) @ W1: x_i's piece moves to the nodes, the difference stays per edge
        assert report.codes(Pass.LINEAR_SPLIT, applied=True) == [Reason.SPLIT_CONCAT]
        assert Reason.CANCELLING_DIFFERENCE in report.codes(Pass.LINEAR_SPLIT, applied=False)
    mask = real_nodes(graph) if padded else slice(None)
    np.testing.assert_allclose(layer(graph).nodes["h"][mask], reference(graph).nodes["h"][mask], **TOL)

    def loss(h, f):
        return jnp.sum(jnp.sin(f(graph._replace(nodes={"h": h})).nodes["h"][mask]))

    np.testing.assert_allclose(jax.grad(loss)(graph.nodes["h"], layer), jax.grad(loss)(graph.nodes["h"], reference),
                               **TOL)


@pytest.mark.parametrize("explicit_rho", [False, True])
def test_gather_reduce_fuses_through_unit_axes(explicit_rho):
    # jgnn.sum of an array message makes [E, 1, F] rows between the product and the scatter: still lane-wise
    rng = _rng()
    graph = random_graph(rng, 20, 80, 7)
    graph = graph._replace(nodes={**graph.nodes, "c": jnp.asarray(rng.uniform(0.2, 1, 20), jnp.float32)})
    W = jnp.asarray(rng.normal(size=(7, 16)), jnp.float32)
    rho = (lambda mb, node: jgnn.sum(mb)) if explicit_rho else None
    parts = (lambda s, d, e: (s["h"] @ W) * (s["c"] * d["c"]), rho, lambda n, a: {"h": a})
    layer = jgnn.message_passing(*parts, backend="xla")
    reference = jgnn.message_passing(*parts, backend="reference")
    (fused,) = [d for d in jgnn.explain(layer, graph).decisions if d.code == Reason.FUSED_REDUCE]
    assert fused.get("edge_operands") == 0  # the [E, 16] messages are made inside the fused op
    np.testing.assert_allclose(layer(graph).nodes["h"], reference(graph).nodes["h"], **TOL)

    def loss(h, f):
        return jnp.sum(jnp.sin(f(graph._replace(nodes={**graph.nodes, "h": h})).nodes["h"]))

    np.testing.assert_allclose(jax.grad(loss)(graph.nodes["h"], layer), jax.grad(loss)(graph.nodes["h"], reference),
                               **TOL)


def test_impure_op_on_edge_data_keeps_its_input_and_still_runs():
    rng = _rng()
    graph = _plain(rng)
    W = jnp.asarray(rng.normal(size=(8, 8)), jnp.float32)
    seen = []

    def model(g):
        m = g.nodes[g.senders] @ W
        jax.debug.callback(lambda x: seen.append(x.shape), m)  # a host callback on edge data: impure
        return g._replace(nodes=jax.ops.segment_sum(m, g.receivers, g.nodes.shape[0]))

    compiled = jgnn.compile(model, backend="xla")
    np.testing.assert_allclose(compiled(graph).nodes, model(graph).nodes, **TOL)
    assert len(seen) == 2, "the callback ran for the compiled and the original program"
    report = jgnn.explain(compiled, graph)
    assert not report.fallbacks
    assert Reason.MESSAGES_STORED_ANYWAY in report.codes(Pass.FUSE, applied=True)  # the callback reads them


@pytest.mark.parametrize("backend", ["xla", "pallas_interpret"])
def test_table_beside_the_graph_is_read_as_endpoint_rows(backend):
    """``table[receivers]`` of an array passed beside the graph (a per-group table of a hierarchical level, a node
    table the user keeps apart) is a dst broadcast like ``nodes[receivers]``: raised, fused as a dst operand (no
    [E, F] edge operand) and equal to plain JAX, on a table that is not the size of the node array."""
    rng = _rng(21)
    n, e, t = 30, 90, 12
    graph = jraph.GraphsTuple(nodes=jnp.asarray(rng.normal(size=(n, 4)), jnp.float32), edges=None,
                              senders=jnp.asarray(rng.integers(0, n, e), jnp.int32),
                              receivers=jnp.asarray(rng.integers(0, t, e), jnp.int32),
                              n_node=jnp.asarray([n]), n_edge=jnp.asarray([e]), globals=None)
    table = jnp.asarray(rng.normal(size=(t, 4)), jnp.float32)

    def model(g, table):
        m = jnp.tanh(g.nodes[g.senders] * table[g.receivers])
        return jax.ops.segment_sum(m, g.receivers, t)

    compiled = jgnn.compile(model, backend=backend)
    report = jgnn.explain(compiled, graph, table)
    assert not report.fallbacks
    (fused,) = [d for d in report.decisions if d.code == Reason.FUSED_REDUCE]
    assert (fused.get("src_operands"), fused.get("dst_operands"), fused.get("edge_operands")) == (1, 1, 0)
    check_against_reference(compiled, model, graph, table)


@pytest.mark.parametrize("backend", ["xla", "pallas_interpret"])
def test_a_difference_with_a_piece_broadcast_along_a_unit_axis_is_not_split(backend):
    """``(x_e − h[src]) @ W`` with ``h`` one feature wide: ``h[src]`` is broadcast along the features before the
    difference, so ``h @ W`` does not fit; the matmul stays whole and says why (fuzz campaign 20261500: the
    split matmul crashed, 123 float64 cases per backend and mode)."""
    rng = np.random.default_rng(21)
    w = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)

    def phi(s, d, e):
        return {"m": jnp.tanh((e["x"] - s["h"]) @ w)}

    parts = (phi, lambda mb, node: {"a": jgnn.sum(mb["m"])}, lambda node, agg: {"h": agg["a"]})
    layer, ref = (jgnn.message_passing(*parts, backend=b) for b in (backend, "reference"))
    n, e = 6, 15
    graph = jraph.GraphsTuple(nodes={"h": jnp.asarray(rng.normal(size=(n, 1)), jnp.float32)},
                              edges={"x": jnp.asarray(rng.normal(size=(e, 4)), jnp.float32)},
                              senders=jnp.asarray(rng.integers(0, n, e), jnp.int32),
                              receivers=jnp.asarray(rng.integers(0, n, e), jnp.int32),
                              n_node=jnp.array([n]), n_edge=jnp.array([e]), globals=None)
    report = jgnn.explain(layer, graph)
    assert Reason.BROADCAST_PIECE in report.codes(Pass.LINEAR_SPLIT, applied=False)
    check_against_reference(lambda g: layer(g).nodes, lambda g: ref(g).nodes, graph)
