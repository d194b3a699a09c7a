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
from jgnn.layout import GraphLayout

E = 240


def _float_residuals(layer, graph, layout=None):
    def loss(h):
        return jnp.sum(jnp.sin(layer(graph._replace(nodes={**graph.nodes, "h": h}), layout=layout).nodes["h"]))

    return [a for a, _ in saved_residuals(loss, graph.nodes["h"]) if a.ndim and jnp.issubdtype(a.dtype, jnp.floating)]


def _edge_residuals(layer, graph, layout=None):
    return [str(a) for a in _float_residuals(layer, graph, layout) if a.shape[0] == E]


# GAT's edge work is all O(1) per element, and RGCN's typed messages are only summed (the derivative of a sum
# linear in them never reads them, so the fused op's tangent does not take them), so "auto" stores nothing
# edge-sized for either. HGT's relation matmuls feed its scores and values, so the backward needs them: with a
# GraphLayout "auto" saves the per-(source, edge type) pair tables instead, and "edges" recomputes them.
# EdgeConv's max keeps a one-byte mask of the edges attaining it; its second MLP layer is an edge matmul the
# max's backward reads, which "edges" recomputes.
@pytest.mark.parametrize("model, remat, with_layout", [
    ("gat", "auto", False), ("rgcn", "auto", False), ("rgcn", "auto", True), ("hgt", "auto", True),
    ("rgcn", "edges", False), ("hgt", "edges", False), ("edgeconv", "edges", False)])
def test_no_edge_sized_float_residuals(model, remat, with_layout):
    rng = np.random.default_rng(0)
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


def test_auto_keeps_edge_matmuls_and_none_keeps_everything():
    rng = np.random.default_rng(0)
    graph = random_graph(rng, 30, E, 9, node_types=2, edge_types=3)
    parts = make_hgt(rng, 9)
    auto = jgnn.message_passing(*parts[:3], backend="xla", remat="auto")
    edges = jgnn.message_passing(*parts[:3], backend="xla", remat="edges")
    none = jgnn.message_passing(*parts[:3], backend="xla", remat="none")
    n_auto, n_edges, n_none = (len(_edge_residuals(m, graph)) for m in (auto, edges, none))
    # Without a layout HGT's relation matmuls cannot be compacted; auto saves them, as UGCG's rule says.
    assert n_edges == 0 < n_auto < n_none
    record = jgnn.explain(auto, graph).remat[0]
    assert record.recomputed and record.edge_matmuls > 0 and record.layout_would_compact


def test_bad_remat_option_is_rejected():
    with pytest.raises(ValueError, match="remat"):
        jgnn.compile(lambda g: g, remat="sometimes")


def test_attention_dropout_mask_is_recomputed_not_stored():
    from jgnn import nn as jnn

    rng = np.random.default_rng(0)
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


def _forward_edge_ops(jaxpr) -> int:
    """How many edge ops that make a reduction's statistics (softmax, max, mean) a jaxpr runs."""
    from jgnn.ops.edge_op import Reduce, edge_op_p

    count = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive is edge_op_p and eqn.params["spec"].reduce in (Reduce.SOFTMAX, Reduce.MAX, Reduce.MEAN):
            count += 1
        for param in eqn.params.values():
            sub = getattr(param, "jaxpr", param)
            if hasattr(sub, "eqns"):
                count += _forward_edge_ops(sub)
    return count


@pytest.mark.parametrize("model", ["gat", "hgt", "edgeconv"])
def test_recomputation_does_not_rerun_fused_forward_ops(model):
    # The per-node statistics a fused op's derivative reads (softmax max, normaliser and output; the max's
    # mask) are named for the policy; unnamed, the backward would run the whole fused forward op again.
    rng = np.random.default_rng(0)
    graph = random_graph(rng, 30, E, 9, node_types=2, edge_types=3)
    parts = {"gat": make_gat, "hgt": make_hgt, "edgeconv": make_edgeconv}[model](rng, 9)

    def ops(remat):
        layer = jgnn.message_passing(*parts[:3], backend="xla", remat=remat)

        def loss(h):
            return jnp.sum(jnp.sin(layer(graph._replace(nodes={**graph.nodes, "h": h})).nodes["h"]))

        return _forward_edge_ops(jax.make_jaxpr(jax.grad(loss))(graph.nodes["h"]).jaxpr)

    assert ops("auto") == ops("none") == 1
