"""Core: message_passing semantics against per-node loop oracles, analysis, explain, fallback, bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import pytest
from graph_cases import pad, random_graph, real_nodes
from hypothesis import given, settings
from hypothesis import strategies as st
from models import loop_oracle, make_gat, make_gcn, make_hgt, make_rgcn, softmax_sum

import jgnn

TOL = dict(rtol=2e-5, atol=2e-5)


def _rng(seed: int = 0):
    return np.random.default_rng(20261123 + seed)


def _layer(parts, backend):
    phi, rho, psi = parts[:3]
    return jgnn.message_passing(phi, rho, psi, backend=backend)


# ---- semantics against independent oracles -------------------------------------------------------------

@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 12), e=st.integers(0, 40), isolated=st.integers(0, 3), d=st.sampled_from([1, 7, 41]))
def test_gat_matches_loop_oracle(n, e, isolated, d):
    rng = _rng()
    graph = random_graph(rng, n, e, d, isolated=min(isolated, n - 1))
    phi, rho, psi, edge_value = make_gat(rng, d)
    out = _layer((phi, rho, psi), "xla")(graph).nodes["h"]
    agg = loop_oracle(graph, edge_value, lambda m, node: softmax_sum(m, node, (3, 4)))
    expected = np.stack([np.asarray(jax.nn.elu(a.reshape(-1))) for a in agg])
    np.testing.assert_allclose(out, expected, **TOL)


@pytest.mark.parametrize("backend", ["reference", "xla"])
def test_gcn_matches_loop_oracle(backend):
    rng = _rng()
    graph = random_graph(rng, 11, 30, 7)
    graph = graph._replace(nodes={**graph.nodes, "c": jnp.asarray(rng.uniform(0.2, 1, 11), jnp.float32)})
    phi, rho, psi = make_gcn(rng, 7)
    out = _layer((phi, rho, psi), backend)(graph).nodes["h"]
    sums = loop_oracle(graph, lambda s, d, e: phi(s, d, e)["m"],
                       lambda m, node: np.sum(m, 0) if m else np.zeros(5, np.float32))
    np.testing.assert_allclose(out, np.maximum(np.stack(sums), 0), **TOL)


def test_rgcn_typed_weights_match_loop_oracle():
    rng = _rng()
    graph = random_graph(rng, 12, 36, 7, edge_types=3)
    phi, rho, psi = make_rgcn(rng, 7)
    out = _layer((phi, rho, psi), "xla")(graph).nodes["h"]
    means = loop_oracle(graph, lambda s, d, e: phi(s, d, e)["m"],
                        lambda m, node: np.mean(m, 0) if m else np.zeros(6, np.float32))
    expected = psi(graph.nodes, jnp.asarray(np.stack(means)))["h"]  # psi is row-wise: apply it to all nodes
    np.testing.assert_allclose(out, expected, **TOL)


def test_hgt_typed_attention_matches_loop_oracle():
    rng = _rng()
    graph = random_graph(rng, 12, 40, 7, node_types=2, edge_types=3)
    phi, rho, psi = make_hgt(rng, 7)
    out = _layer((phi, rho, psi), "xla")(graph).nodes["h"]
    agg = loop_oracle(graph, lambda s, d, e: (phi(s, d, e)["score"], phi(s, d, e)["msg"]),
                      lambda m, node: softmax_sum(m, node, (2, 3)))
    expected = np.stack([np.asarray(jax.nn.gelu(jnp.asarray(a).reshape(-1))) for a in agg])
    np.testing.assert_allclose(out, expected, **TOL)
    assert "type" in _layer((phi, rho, psi), "xla")(graph).nodes, "node types are carried over"


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min"])
def test_reductions_and_empty_mailboxes(kind):
    rng = _rng()
    graph = random_graph(rng, 9, 25, 7, isolated=3)
    reduce = getattr(jgnn, kind)
    layer = jgnn.message_passing(lambda s, d, e: s["h"] * 2 - d["h"], lambda mb, node: reduce(mb))
    out = np.asarray(layer(graph).nodes)
    np_reduce = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[kind]
    expected = loop_oracle(graph, lambda s, d, e: np.asarray(s["h"] * 2 - d["h"]),
                           lambda m, node: np_reduce(np.stack(m), 0) if m else np.zeros(7, np.float32))
    np.testing.assert_allclose(out, np.stack(expected), **TOL)
    assert np.all(out[-3:] == 0), "isolated nodes reduce to 0 (documented)"


@pytest.mark.parametrize("backend", ["xla", "pallas_interpret"])
def test_derivatives_of_a_fused_custom_jvp_op_without_edges(backend):
    """E = 0 with jax.nn.relu (a custom_jvp call) in phi: the derived edge ops' operand pruning traced the region
    at one row, which a custom call's body (fixed at its traced zero rows) cannot run at (fuzz campaign
    20261124, 320 cases)."""
    rng = _rng()
    graph = random_graph(rng, 5, 0, 8, isolated=0, duplicates=0)
    w = jnp.asarray(rng.normal(size=(8, 8)), jnp.float32)

    def run(backend, h, w):
        layer = jgnn.message_passing(lambda s, d, e: {"m": jax.nn.relu(d["h"] @ w)},
                                     lambda mb, node: {"a": jgnn.sum(mb["m"])}, backend=backend)
        return layer(graph._replace(nodes={"h": h})).nodes["a"]

    h = graph.nodes["h"]
    for b in ("reference", backend):
        _, tangent = jax.jit(lambda h, w, b=b: jax.jvp(lambda h, w: run(b, h, w), (h, w), (h, w)))(h, w)
        grads = jax.jit(jax.grad(lambda h, w, b=b: run(b, h, w).sum(), argnums=(0, 1)))(h, w)
        np.testing.assert_array_equal(tangent, np.zeros((5, 8), np.float32))
        np.testing.assert_array_equal(grads[1], np.zeros((8, 8), np.float32))


def test_jraph_padding_does_not_change_real_nodes():
    rng = _rng()
    graph = random_graph(rng, 10, 30, 7)
    phi, rho, psi, _ = make_gat(rng, 7)
    padded = pad(graph)
    layer = _layer((phi, rho, psi), "xla")
    out = layer(padded).nodes["h"][real_nodes(padded)]
    np.testing.assert_allclose(out, layer(graph).nodes["h"], **TOL)


def test_evaluator_runs_the_traced_program_bit_for_bit():
    """Analysis plus jgnn's own evaluator, before any rewrite, reproduce the reference exactly."""
    from jgnn import compiler, ir

    rng = _rng()
    graph = random_graph(rng, 14, 50, 41, edge_types=3, node_types=2)
    for parts in (make_gat(rng, 41), make_rgcn(rng, 41), make_hgt(rng, 41)):
        layer = _layer(parts, "reference")
        flat = compiler.flatten_arguments(((graph,), {}))
        closed, out_shape = compiler._trace(layer.reference, flat)
        plan = compiler.build_plan(closed, out_shape, flat, backend="reference", remat="none", layouts={})
        assert not plan.report.fallbacks and not plan.report.rewrites
        consts = ir.captured_consts(closed)
        evaluated = jax.jit(lambda arrays, p=plan: ir.evaluate(p.program, arrays)[0])(list(flat.arrays) + consts)
        reference = jax.jit(lambda g, lay=layer: jax.tree_util.tree_leaves(lay.reference(g).nodes)[0])(graph)
        np.testing.assert_array_equal(np.asarray(evaluated), np.asarray(reference))


def test_globals_reach_phi_and_psi():
    rng = _rng()
    graph = random_graph(rng, 12, 30, 4, globals_dim=4, n_graphs=3)
    layer = jgnn.message_passing(lambda s, d, e, g: s["h"] * g, None, lambda node, agg, g: agg + g)
    out = np.asarray(layer(graph).nodes)
    g_of_node = np.repeat(np.arange(3), np.asarray(graph.n_node))
    glob = np.asarray(graph.globals)
    msgs = np.asarray(graph.nodes["h"])[np.asarray(graph.senders)] * glob[g_of_node[np.asarray(graph.senders)]]
    expected = np.zeros((12, 4), np.float32)
    np.add.at(expected, np.asarray(graph.receivers), msgs)
    np.testing.assert_allclose(out, expected + glob[g_of_node], **TOL)


# ---- transformations -----------------------------------------------------------------------------------

def test_grad_vmap_value_and_grad_through_compiled_layer():
    rng = _rng()
    graph = random_graph(rng, 10, 30, 7)
    phi, rho, psi, _ = make_gat(rng, 7)

    def loss(h, backend):
        return jnp.sum(_layer((phi, rho, psi), backend)(graph._replace(nodes={"h": h})).nodes["h"] ** 2)

    h = graph.nodes["h"]
    g_c = jax.jit(jax.grad(loss), static_argnums=1)(h, "xla")
    g_r = jax.grad(loss)(h, "reference")
    np.testing.assert_allclose(g_c, g_r, **TOL)
    v, g = jax.value_and_grad(loss)(h, "xla")
    np.testing.assert_allclose(v, loss(h, "reference"), rtol=1e-5)
    batch = jnp.stack([h, 2 * h])
    np.testing.assert_allclose(jax.vmap(lambda x: loss(x, "xla"))(batch),
                               jax.vmap(lambda x: loss(x, "reference"))(batch), rtol=1e-5)


def _jraph_models(rng, d):
    W = _w = jnp.asarray(rng.normal(size=(d, 5)) / np.sqrt(d), jnp.float32)
    del _w
    gcn = jraph.GraphConvolution(lambda x: x @ W, add_self_edges=True)
    gat = jraph.GAT(attention_query_fn=lambda x: x @ W,
                    attention_logit_fn=lambda s, r, e: jnp.sum(s * r, -1, keepdims=True) * 0.1)
    mlp = lambda k: (lambda *xs: jnp.tanh(jnp.concatenate(xs, -1) @ jnp.asarray(
        np.random.default_rng(k).normal(size=(sum(x.shape[-1] for x in xs), 5)) * 0.3, jnp.float32)))
    net = jraph.GraphNetwork(update_edge_fn=mlp(1), update_node_fn=mlp(2), update_global_fn=mlp(3))
    inter = jraph.InteractionNetwork(update_edge_fn=mlp(4), update_node_fn=mlp(5))
    return {"GraphConvolution": gcn, "GAT": gat, "GraphNetwork": net, "InteractionNetwork": inter}


def _plain_graph(rng, n=11, e=30, d=7):
    g = random_graph(rng, n, e, d, d_edge=3, globals_dim=2)
    return g._replace(nodes=g.nodes["h"], edges=g.edges["x"])


@pytest.mark.parametrize("name", ["GraphConvolution", "GAT", "GraphNetwork", "InteractionNetwork"])
def test_compile_unmodified_jraph_models(name):
    rng = _rng()
    graph = _plain_graph(rng)
    model = _jraph_models(rng, 7)[name]
    compiled = jgnn.compile(model, backend="xla")
    leaves = lambda g: jax.tree_util.tree_leaves((g.nodes, g.edges, g.globals))
    for a, b in zip(leaves(jax.jit(compiled)(graph)), leaves(model(graph)), strict=True):
        np.testing.assert_allclose(a, b, **TOL)

    def loss(nodes, f):
        out = f(graph._replace(nodes=nodes))
        return sum(jnp.sum(x ** 2) for x in leaves(out))

    np.testing.assert_allclose(jax.grad(loss)(graph.nodes, compiled), jax.grad(loss)(graph.nodes, model), **TOL)
    assert not jgnn.explain(compiled, graph).fallbacks


# ---- explain -------------------------------------------------------------------------------------------

def test_explain_combinator_gat_shows_movements():
    rng = _rng()
    graph = random_graph(rng, 10, 30, 7)
    phi, rho, psi, _ = make_gat(rng, 7)
    report = jgnn.explain(jgnn.message_passing(phi, rho, psi, backend="xla"), graph)
    movements = {e.movement for e in report.equations}
    assert {"broadcast_src", "broadcast_dst", "norm", "reduce"} <= movements
    assert all(e.out_residency in {"shared", "graph", "node_type", "edge_type", "node", "edge"}
               for e in report.equations)
    norm = [e for e in report.equations if e.movement == "norm"]
    assert all(e.out_residency == "edge" for e in norm)
    text = str(report)
    assert "broadcast_src" in text and "fallbacks" in text


def test_explain_jraph_graph_convolution():
    rng = _rng()
    graph = _plain_graph(rng)
    model = jraph.GraphConvolution(lambda x: x * 2.0, add_self_edges=False)
    report = jgnn.explain(model, graph)
    movements = {e.movement for e in report.equations}
    assert {"broadcast_src", "reduce"} <= movements
    reduces = [e for e in report.equations if e.movement == "reduce"]
    assert all(e.out_residency == "node" for e in reduces)


def test_explain_typed_weights_are_type_broadcasts():
    rng = _rng()
    graph = random_graph(rng, 10, 30, 7, edge_types=3)
    report = jgnn.explain(_layer(make_rgcn(rng, 7), "xla"), graph)
    assert any(e.movement == "broadcast_type" and e.out_residency == "edge" for e in report.equations)


# ---- fallback ------------------------------------------------------------------------------------------

def test_data_dependent_gather_falls_back_and_stays_correct():
    rng = _rng()
    graph = _plain_graph(rng)

    def model(g):
        order = jnp.argsort(g.nodes[:, 0])  # a data-dependent permutation of the nodes
        h = g.nodes[order] * 2.0
        m = jax.ops.segment_sum(h[g.senders], g.receivers, g.nodes.shape[0])
        return g._replace(nodes=m + g.nodes)

    compiled = jgnn.compile(model, backend="xla")
    np.testing.assert_allclose(compiled(graph).nodes, model(graph).nodes, **TOL)
    report = jgnn.explain(compiled, graph)
    assert {f.code for f in report.fallbacks} & {jgnn.Reason.DATA_DEPENDENT_PERMUTATION,
                                                jgnn.Reason.DATA_DEPENDENT_GATHER}


# ---- bad input -----------------------------------------------------------------------------------------

def test_validate_names_the_problem():
    rng = _rng()
    graph = _plain_graph(rng)
    n = graph.nodes.shape[0]
    cases = [
        (graph._replace(senders=graph.senders.at[3].set(n + 5)), ValueError, "senders"),
        (graph._replace(receivers=graph.receivers.at[0].set(-1)), ValueError, "receivers"),
        (graph._replace(senders=graph.senders.astype(jnp.float32)), TypeError, "senders"),
        (graph._replace(n_node=jnp.array([n + 1])), ValueError, "n_node"),
        (graph._replace(n_edge=jnp.array([1])), ValueError, "n_edge"),
        (graph._replace(edges=graph.edges[:-1]), ValueError, "edges"),
        (graph._replace(receivers=graph.receivers[:-1]), ValueError, "receivers"),
    ]
    for bad, err, field in cases:
        with pytest.raises(err, match=field):
            jgnn.validate(bad)
    with pytest.raises(ValueError, match="type"):
        jgnn.validate(graph, typed=True)
    typed = random_graph(rng, 10, 20, 3, edge_types=2)
    with pytest.raises(ValueError, match="type"):
        jgnn.validate(typed._replace(edges={"type": typed.edges["type"].at[0].set(7)}), typed=True,
                      num_edge_types=2)


def test_layer_rejects_bad_graph_before_tracing():
    rng = _rng()
    graph = random_graph(rng, 8, 20, 3)
    layer = jgnn.message_passing(lambda s, d, e: s["h"])
    with pytest.raises(ValueError, match="senders"):
        layer(graph._replace(senders=graph.senders.at[0].set(99)))


def test_rho_may_not_reduce_the_mailbox_axis_by_hand():
    rng = _rng()
    graph = random_graph(rng, 8, 20, 3)
    bad = jgnn.message_passing(lambda s, d, e: s["h"], lambda mb, node: jnp.sum(mb, axis=0))
    with pytest.raises(jgnn.UnsupportedMailboxOp, match="reduce_sum"):
        bad(graph)
    unreduced = jgnn.message_passing(lambda s, d, e: s["h"], lambda mb, node: mb * 2)
    with pytest.raises(jgnn.UnsupportedMailboxOp, match="must reduce"):
        unreduced(graph)
    with pytest.raises(jgnn.UnsupportedMailboxOp, match="inside rho"):
        jgnn.sum(jnp.ones((3, 2)))


def test_bad_backend_is_rejected():
    with pytest.raises(ValueError, match="backend"):
        jgnn.compile(lambda g: g, backend="cuda")
