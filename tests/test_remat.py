"""Recomputation: a compiled training step stores no edge-sized floating-point residual."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from graph_cases import random_graph
from jax._src.ad_checkpoint import saved_residuals
from models import make_edgeconv, make_gat, make_hgt, make_rgcn

import jgnn
from jgnn import edge_blocks
from jgnn.layout import GraphLayout

E = 240


def _float_residuals(layer, graph, layout=None):
    def loss(h):
        return jnp.sum(jnp.sin(layer(graph._replace(nodes={**graph.nodes, "h": h}), layout=layout).nodes["h"]))

    return [a for a, _ in saved_residuals(loss, graph.nodes["h"]) if a.ndim and jnp.issubdtype(a.dtype, jnp.floating)]


def _edge_residuals(layer, graph, layout=None):
    return [str(a) for a in _float_residuals(layer, graph, layout) if a.shape[0] == E]


# GAT's edge work is all O(1) per element, and RGCN's typed messages are only summed (a backward that never
# reads them), so "auto" stores nothing edge-sized for either. HGT's relation matmuls feed its scores and values,
# so the backward needs them: with a GraphLayout "auto" saves the per-(source, edge type) pair tables instead,
# and "edges" recomputes them. EdgeConv's max keeps per-node maxima and tie counts; its second MLP layer is an
# edge matmul the max's backward reads, which "edges" recomputes.
@pytest.mark.parametrize("model, remat, with_layout", [
    ("gat", "auto", False), ("rgcn", "auto", False), ("rgcn", "auto", True), ("hgt", "auto", True),
    ("rgcn", "edges", False), ("hgt", "edges", False), ("edgeconv", "edges", False)])
def test_no_edge_sized_float_residuals(model, remat, with_layout):
    rng = np.random.default_rng()
    graph = random_graph(rng, 30, E, 9, node_types=2, edge_types=3)
    layout = GraphLayout.from_graph(graph) if with_layout else None
    parts = {"gat": make_gat, "rgcn": make_rgcn, "hgt": make_hgt, "edgeconv": make_edgeconv}[model](rng, 9)
    reference = jgnn.message_passing(*parts[:3], backend="reference")
    compiled = jgnn.message_passing(*parts[:3], backend="xla", remat=remat)
    assert _edge_residuals(reference, graph), "the reference stores edge-sized values"
    assert not _edge_residuals(compiled, graph, layout)
    report = jgnn.explain(compiled, graph, layout=layout)
    assert report.remat and report.remat[0].policy == remat
    if model == "hgt" and with_layout:  # what stands in for the edge matmuls: fewer rows than edges
        pairs = layout.pairs.pair_src.shape[0]
        assert pairs < E and [a for a in _float_residuals(compiled, graph, layout) if a.shape[0] == pairs]

    def loss(h, layer):
        return jnp.sum(jnp.sin(layer(graph._replace(nodes={**graph.nodes, "h": h}), layout=layout).nodes["h"]))

    np.testing.assert_allclose(jax.grad(loss)(graph.nodes["h"], compiled), jax.grad(loss)(graph.nodes["h"], reference),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lane", ["linear", "scaled", "nonlinear"])
def test_gather_reduce_keeps_edge_operands_only_when_its_backward_reads_them(lane):
    rng = np.random.default_rng()
    n, d = 17, 7
    senders, receivers = (jnp.asarray(rng.integers(0, n, E), jnp.int32) for _ in range(2))
    x, m = jnp.asarray(rng.normal(size=(n, d)), jnp.float32), jnp.asarray(rng.normal(size=(E, d)), jnp.float32)
    c = jnp.asarray(rng.uniform(0.5, 1, size=(E, 1)), jnp.float32)  # a normaliser nobody differentiates
    lane_fn = {"linear": lambda s, dd, e: s[0] * 0.5 + e[0],
               "scaled": lambda s, dd, e: s[0] * 0.5 + e[0] * e[1],  # RGCN: ∂c would read m, but c is constant
               "nonlinear": lambda s, dd, e: s[0] * jnp.sin(e[0])}[lane]

    def blocked(x, m):  # blocks of 64 edges: several blocks and a padded last one
        return jnp.sum(jnp.cos(edge_blocks.gather_reduce_sum(lane_fn, n, 64, (x,), (), (m, c), senders, receivers)))

    def plain(x, m):
        return jnp.sum(jnp.cos(jax.ops.segment_sum(lane_fn((x[senders],), (), (m, c)), receivers, n)))

    kept = [a for a, _ in saved_residuals(blocked, x, m) if a.shape == m.shape]
    assert (kept == []) if lane != "nonlinear" else kept
    for got, want in zip(jax.grad(blocked, (0, 1))(x, m), jax.grad(plain, (0, 1))(x, m), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_auto_keeps_edge_matmuls_and_none_keeps_everything():
    rng = np.random.default_rng()
    graph = random_graph(rng, 30, E, 9, node_types=2, edge_types=3)
    parts = make_hgt(rng, 9)
    auto = jgnn.message_passing(*parts[:3], backend="xla", remat="auto")
    edges = jgnn.message_passing(*parts[:3], backend="xla", remat="edges")
    none = jgnn.message_passing(*parts[:3], backend="xla", remat="none")
    n_auto, n_edges, n_none = (len(_edge_residuals(m, graph)) for m in (auto, edges, none))
    # Without a layout HGT's relation matmuls cannot be compacted; auto saves them, as UGCG's rule says.
    assert n_edges == 0 < n_auto < n_none
    record = jgnn.explain(auto, graph).remat[0]
    assert record.recomputed and "GraphLayout" in record.detail and "remat='edges'" in record.detail


def test_bad_remat_option_is_rejected():
    with pytest.raises(ValueError, match="remat"):
        jgnn.compile(lambda g: g, remat="sometimes")


def test_attention_dropout_mask_is_recomputed_not_stored():
    from jgnn import nn as jnn

    rng = np.random.default_rng()
    graph = random_graph(rng, 30, E, 9)._replace(edges=None)
    graph = graph._replace(nodes=graph.nodes["h"])
    e_rows = {E, E + 30}  # GATConv adds a self-loop per node
    rngs = {"dropout": jax.random.PRNGKey(int(rng.integers(1 << 30)))}

    def loss(params, backend):
        module = jnn.GATConv(4, num_heads=2, attention_dropout=0.5, backend=backend)
        return jnp.sum(jnp.sin(module.apply(params, graph, deterministic=False, rngs=rngs).nodes))

    params = jnn.GATConv(4, num_heads=2).init(jax.random.PRNGKey(0), graph)
    residuals = saved_residuals(lambda p: loss(p, "xla"), params)
    assert not [a for a, _ in residuals if a.ndim and a.shape[0] in e_rows and jnp.issubdtype(a.dtype, jnp.floating)]
    grads = [jax.grad(loss)(params, b) for b in ("xla", "reference")]
    # Weight gradients sum every edge's term (magnitudes up to ~10): float32 reassociation between the blocked
    # online-softmax backward and XLA's reaches a few 1e-6 near zero, so the suite's usual 1e-5 applies.
    for a, b in zip(jax.tree_util.tree_leaves(grads[0]), jax.tree_util.tree_leaves(grads[1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", ["gat", "hgt"])
def test_recomputation_does_not_rerun_fused_forward_loops(model, monkeypatch):
    # The attention VJP's log-sum-exp is made inside its forward rule; if the policy could not name it, the
    # backward would run the whole blocked forward loop again to remake it.
    monkeypatch.setenv("JGNN_EDGE_BLOCK_BYTES", "2048")  # several edge blocks: the loops stay loops
    rng = np.random.default_rng()
    graph = random_graph(rng, 30, E, 9, node_types=2, edge_types=3)
    parts = {"gat": make_gat, "hgt": make_hgt}[model](rng, 9)

    def loops(remat):
        layer = jgnn.message_passing(*parts[:3], backend="xla", remat=remat)

        def loss(h):
            return jnp.sum(jnp.sin(layer(graph._replace(nodes={**graph.nodes, "h": h})).nodes["h"]))

        return jax.jit(jax.grad(loss)).lower(graph.nodes["h"]).compile().as_text().count(" while(")

    assert loops("auto") == loops("none") > 0
