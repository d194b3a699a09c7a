"""Layers on the kernel backends: interpret-mode numerics vs the reference and CUDA lowering without a GPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import pytest
from graph_cases import random_graph
from models import make_gcn

import jgnn
from jgnn import Pass, Reason
from jgnn.layout import GraphLayout
from pallas_kernels import compat

TOL = dict(rtol=1e-5, atol=1e-5)
SEED = 20261123


def _gcn_graph(rng, n=14, e=50, d=7):
    g = random_graph(rng, n, e, d, isolated=2, hub=12)
    return g._replace(nodes={**g.nodes, "c": jnp.asarray(rng.uniform(0.2, 1, n), jnp.float32)})


@pytest.mark.parametrize("with_layout", [False, True])
def test_pallas_interpret_layer_uses_kernel_and_matches_reference(with_layout):
    rng = np.random.default_rng(SEED)
    graph = _gcn_graph(rng)
    phi, rho, psi = make_gcn(rng, 7)
    layer = jgnn.message_passing(phi, rho, psi, backend="pallas_interpret")
    reference = jgnn.message_passing(phi, rho, psi, backend="reference")
    layout = GraphLayout.from_graph(graph) if with_layout else None
    report = jgnn.explain(layer, graph, layout=layout)
    expected = [("gather_reduce(sum)", "kernel", Reason.LOWER_KERNEL)]
    assert [(k.op, k.lowering, k.code) for k in report.kernels] == expected
    np.testing.assert_allclose(layer(graph, layout=layout).nodes["h"], reference(graph).nodes["h"], **TOL)

    def loss(h, f):
        return jnp.sum(jnp.sin(f(graph._replace(nodes={**graph.nodes, "h": h})).nodes["h"]))

    np.testing.assert_allclose(jax.grad(loss)(graph.nodes["h"], layer), jax.grad(loss)(graph.nodes["h"], reference),
                               **TOL)



@pytest.mark.parametrize("kind", ["sum", "attention"])
def test_device_scalars_closed_over_by_phi_reach_the_kernels(kind):
    """A scale and a dropout seed held as device scalars (``jnp.float32(0.5)``, ``jnp.int32(3)``) were consts
    captured by the kernel's body: Pallas raised ``captures constants`` on the kernel backends (found by
    compiling every GPU kernel case through `jgnn.message_passing`). Python numbers always worked."""
    from jgnn.nn._utils import AttentionDropout

    rng = np.random.default_rng(SEED)
    n, e, heads = 12, 40, 4
    scale, drop = jnp.float32(0.5), AttentionDropout(jnp.int32(3), 0.2)
    graph = jraph.GraphsTuple(
        nodes={"k": jnp.asarray(rng.normal(size=(n, heads, 8)), jnp.float32),
               "v": jnp.asarray(rng.normal(size=(n, heads, 8)), jnp.float32)},
        edges={"b": jnp.asarray(rng.normal(size=(e, heads)), jnp.float32), **drop.edge_features(e)},
        senders=jnp.asarray(rng.integers(0, n, e), jnp.int32), receivers=jnp.asarray(rng.integers(0, n, e), jnp.int32),
        n_node=jnp.array([n]), n_edge=jnp.array([e]), globals=None)

    def phi(src, dst, edge):
        return {"s": jnp.sum(src["k"] * dst["k"], -1) * scale + edge["b"], "v": src["v"] * scale,
                "mask": drop.scale(edge, heads)}

    def rho(mb, node):
        if kind == "sum":
            return {"out": jgnn.sum(mb["v"])}
        return {"out": jgnn.sum((jgnn.softmax(mb["s"]) * mb["mask"])[..., None] * mb["v"])}

    layer = jgnn.message_passing(phi, rho, None, backend="pallas_interpret")
    reference = jgnn.message_passing(phi, rho, None, backend="reference")
    assert [k.lowering for k in jgnn.explain(layer, graph).kernels] == ["kernel"]
    np.testing.assert_allclose(layer(graph).nodes["out"], reference(graph).nodes["out"], **TOL)

def test_compiled_jraph_gcn_on_kernel_matches():
    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 12, 40, 7)
    graph = graph._replace(nodes=graph.nodes["h"])
    model = jraph.GraphConvolution(lambda x: x * 2.0)
    compiled = jgnn.compile(model, backend="pallas_interpret")
    np.testing.assert_allclose(compiled(graph).nodes, model(graph).nodes, **TOL)
    assert [k.lowering for k in jgnn.explain(compiled, graph).kernels] == ["kernel"]


@pytest.mark.parametrize("model", ["gat", "hgt", "rgcn"])
def test_attention_and_typed_layers_lower_for_cuda(model):
    from models import make_gat, make_hgt, make_rgcn

    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 16, 60, 7, node_types=2, edge_types=3)
    parts = {"gat": make_gat, "hgt": make_hgt, "rgcn": make_rgcn}[model](rng, 7)
    layer = jgnn.message_passing(*parts[:3], backend="pallas")
    kernels = {k.op for k in jgnn.explain(layer, graph).kernels}
    assert kernels >= {"rgcn": {"typed_matmul"}, "gat": {"attention"}, "hgt": {"typed_matmul", "attention"}}[model]

    def step(h):
        return jax.value_and_grad(lambda x: jnp.sum(layer(graph._replace(nodes={**graph.nodes, "h": x})).nodes["h"]))(h)

    assert compat.TRITON_CUSTOM_CALL in compat.export_cuda_mlir(step, graph.nodes["h"])


def test_pallas_backend_lowers_for_cuda_without_a_gpu():
    rng = np.random.default_rng(SEED)
    graph = _gcn_graph(rng, d=41)
    phi, rho, psi = make_gcn(rng, 41, d_out=41)
    layer = jgnn.message_passing(phi, rho, psi, backend="pallas")

    def step(h):
        return jax.value_and_grad(lambda x: jnp.sum(layer(graph._replace(nodes={**graph.nodes, "h": x})).nodes["h"]))(h)

    # the forward walk plus at least the reverse-CSR walk for the source gradient
    assert compat.export_cuda_mlir(step, graph.nodes["h"]).count(compat.TRITON_CUSTOM_CALL) >= 2


def _attention_cases(rng, d=7):
    from models import make_gat, make_hgt

    return {"gat": make_gat(rng, d), "gat_naive": make_gat(rng, d, naive=True), "hgt": make_hgt(rng, d)}


@pytest.mark.parametrize("model", ["gat", "gat_naive", "hgt"])
@pytest.mark.parametrize("backend", ["xla", "pallas_interpret"])
def test_attention_is_fused_and_matches_reference(model, backend):
    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 16, 60, 7, node_types=2, edge_types=3, isolated=2, hub=10)
    phi, rho, psi = _attention_cases(rng)[model][:3]
    layer = jgnn.message_passing(phi, rho, psi, backend=backend)
    reference = jgnn.message_passing(phi, rho, psi, backend="reference")
    report = jgnn.explain(layer, graph)
    kernels = {k.op: k for k in report.kernels}
    # GAT's lane-wise scores and HGT's dot-product scores (safe on zero-padded lanes) both run on the kernel.
    assert kernels["attention"].lowering == {"xla": "segment", "pallas_interpret": "kernel"}[backend]
    np.testing.assert_allclose(layer(graph).nodes["h"], reference(graph).nodes["h"], **TOL)

    def loss(h, f):
        return jnp.sum(jnp.sin(f(graph._replace(nodes={**graph.nodes, "h": h})).nodes["h"]))

    np.testing.assert_allclose(jax.grad(loss)(graph.nodes["h"], layer), jax.grad(loss)(graph.nodes["h"], reference),
                               **TOL)


@pytest.mark.parametrize("backend", ["xla", "pallas_interpret"])
def test_raw_jraph_segment_softmax_is_recognised(backend):
    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 14, 50, 7)._replace(edges=None)
    graph = graph._replace(nodes=graph.nodes["h"])
    W = jnp.asarray(rng.normal(size=(7, 5)) / 3, jnp.float32)
    model = jraph.GAT(attention_query_fn=lambda x: x @ W,
                      attention_logit_fn=lambda s, r, e: jnp.sum(s * r, -1, keepdims=True))
    compiled = jgnn.compile(model, backend=backend)
    np.testing.assert_allclose(compiled(graph).nodes, model(graph).nodes, **TOL)
    # jraph's scores are [E, 1]: one head, broadcast over the value width
    assert [(k.op, k.lowering) for k in jgnn.explain(compiled, graph).kernels] == [
        ("attention", {"xla": "segment", "pallas_interpret": "kernel"}[backend])]


def test_softmax_used_outside_a_weighted_sum_is_a_norm_op():
    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 14, 50, 7)
    graph = graph._replace(nodes=graph.nodes["h"])

    def model(g):
        logits = jnp.sum(g.nodes[g.senders] * g.nodes[g.receivers], -1)
        alpha = jraph.segment_softmax(logits, g.receivers, g.nodes.shape[0])
        return g._replace(edges=alpha)  # the weights themselves are the output

    compiled = jgnn.compile(model, backend="xla")
    np.testing.assert_allclose(compiled(graph).edges, model(graph).edges, **TOL)
    report = jgnn.explain(compiled, graph)
    assert Reason.RAISED_SOFTMAX in report.codes(Pass.CANONICALIZE)
    assert not report.kernels


# GAT and HGT take about 20 s each on 2 cores: they run in the slow tier (CI's second step), GCN and RGCN here.
@pytest.mark.parametrize("model", [pytest.param(m, marks=pytest.mark.slow) for m in ("gat", "hgt")] + ["gcn", "rgcn"])
def test_edge_blocked_xla_lowering_matches_reference(model, monkeypatch):
    from models import make_gat, make_hgt, make_rgcn

    monkeypatch.setenv("JGNN_EDGE_TEMP_BYTES", "1500")  # many small blocks, the last one ragged
    rng = np.random.default_rng(SEED)
    graph = _gcn_graph(rng, n=30, e=211)
    graph = graph._replace(nodes={**graph.nodes, "type": jnp.asarray(rng.integers(0, 2, 30), jnp.int32)},
                           edges={"type": jnp.asarray(rng.integers(0, 3, 211), jnp.int32)})
    parts = {"gat": make_gat, "hgt": make_hgt, "gcn": make_gcn, "rgcn": make_rgcn}[model](rng, 7)
    layer = jgnn.message_passing(*parts[:3], backend="xla")
    reference = jgnn.message_passing(*parts[:3], backend="reference")
    assert "blocks" in {k.lowering for k in jgnn.explain(layer, graph).kernels}
    np.testing.assert_allclose(layer(graph).nodes["h"], reference(graph).nodes["h"], **TOL)

    def loss(h, f):
        return jnp.sum(jnp.sin(f(graph._replace(nodes={**graph.nodes, "h": h})).nodes["h"]))

    np.testing.assert_allclose(jax.grad(loss)(graph.nodes["h"], layer), jax.grad(loss)(graph.nodes["h"], reference),
                               **TOL)


@jax.custom_vjp
def _scaled_grad(x):
    return jnp.tanh(x)


# a deliberately different backward, so that a test sees whether the custom rule ran
_scaled_grad.defvjp(lambda x: (jnp.tanh(x), x), lambda x, g: (3.0 * g * x,))


@pytest.mark.parametrize("backend", ["xla", "pallas_interpret"])
@pytest.mark.parametrize("fn", ["relu", "custom_vjp"])
def test_custom_derivative_functions_in_phi(fn, backend, monkeypatch):
    """`jax.nn.relu` (a custom_jvp whose body is a ``jit`` traced at E rows) in phi runs on edge blocks and kernel
    tiles: its callee and JVP jaxprs are traced again per block (a crash before), and its rule stays (relu's zero
    gradient at 0, where max(x, 0) alone splits in halves). A custom_vjp's backward checks its traced shapes, so
    its edge ops run on all rows at once (`FIXED_SHAPE_BODY`); its gradient is its rule's (it crashed)."""
    monkeypatch.setenv("JGNN_EDGE_TEMP_BYTES", "600")
    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 9, 40, 4)
    h = graph.nodes["h"].at[:3].set(0.0)  # relu's kink, where the custom rule and max's differ
    act = {"relu": jax.nn.relu, "custom_vjp": _scaled_grad}[fn]

    def phi(src, dst, edge):
        return {"a": act(src["h"] - dst["h"]) + act(src["h"]), "b": act(dst["h"] - src["h"])}

    def rho(mailbox, node):
        return {"s": jgnn.sum(mailbox["a"]), "x": jgnn.max(mailbox["b"])}

    layer, reference = (jgnn.message_passing(phi, rho, lambda n, a: {"h": a["s"] * a["x"]}, backend=b)
                        for b in (backend, "reference"))
    lowered = {"relu": {"xla": ("blocks", Reason.LOWER_BLOCKS), "pallas_interpret": ("kernel", Reason.LOWER_KERNEL)},
               "custom_vjp": {b: ("segment", Reason.FIXED_SHAPE_BODY) for b in ("xla", "pallas_interpret")}}
    assert {(k.lowering, k.code) for k in jgnn.explain(layer, graph).kernels} == {lowered[fn][backend]}

    def loss(x, f):
        return jnp.sum(jnp.sin(f(graph._replace(nodes={"h": x})).nodes["h"]))

    np.testing.assert_allclose(loss(h, layer), loss(h, reference), **TOL)
    np.testing.assert_allclose(jax.jit(jax.grad(loss), static_argnums=1)(h, layer), jax.grad(loss)(h, reference),
                               **TOL)
    if fn == "relu":  # a custom_vjp has no forward mode
        t = jnp.asarray(rng.normal(size=h.shape), h.dtype)
        (_, jk), (_, jr) = (jax.jvp(lambda x, f=f: loss(x, f), (h,), (t,)) for f in (layer, reference))
        np.testing.assert_allclose(jk, jr, **TOL)


def test_graph_network_with_edge_outputs_on_the_kernel_backend():
    from test_core import _plain_graph

    rng = np.random.default_rng(SEED)
    graph = _plain_graph(rng, n=16, e=70, d=7)
    w = jnp.asarray(rng.normal(size=(7 + 7 + 3 + 2, 5)) * 0.3, jnp.float32)
    model = jraph.GraphNetwork(update_edge_fn=lambda e, s, r, g: jnp.tanh(jnp.concatenate([e, s, r, g], -1) @ w),
                               update_node_fn=lambda n, s, r, g: n * jnp.sum(r, -1, keepdims=True))
    compiled = jgnn.compile(model, backend="pallas_interpret")
    report = jgnn.explain(compiled, graph)
    # the new edges are an output: one edge op makes them, and the sums read the stored rows on the kernel
    assert {Reason.MESSAGES_STORED_ANYWAY, Reason.FUSED_COMPUTE} <= set(report.codes(Pass.FUSE, applied=True))
    assert [k.lowering for k in report.kernels if k.op.startswith("gather_reduce")] == ["kernel"]
    assert not report.fallbacks
    for a, b in zip(jax.tree_util.tree_leaves(compiled(graph)), jax.tree_util.tree_leaves(model(graph)), strict=True):
        np.testing.assert_allclose(a, b, **TOL)

    def loss(nodes, f):
        return sum(jnp.sum(jnp.sin(x)) for x in jax.tree_util.tree_leaves(f(graph._replace(nodes=nodes))))

    np.testing.assert_allclose(jax.grad(loss)(graph.nodes, compiled), jax.grad(loss)(graph.nodes, model),
                               rtol=2e-4, atol=2e-4)
    # on the GPU backend, the reduction of the stored edges lowers to the Triton kernel, forward and backward
    on_gpu = jgnn.compile(model, backend="pallas")
    step = jax.value_and_grad(lambda nodes: loss(nodes, on_gpu))
    assert compat.TRITON_CUSTOM_CALL in compat.export_cuda_mlir(step, graph.nodes)


@pytest.mark.parametrize("backend", ["xla", "pallas_interpret"])
def test_stored_messages_reduced_by_mean_max_and_sum(backend):
    """Messages returned beside their reductions (sum, mean, max, with ties from duplicate edges and empty rows):
    one per-edge op makes them and each reduction reads them; values, gradients and tangents equal plain jit."""
    from checks import check_against_reference

    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 12, 50, 6)
    graph = graph._replace(senders=graph.senders.at[1].set(graph.senders[0]),
                           receivers=graph.receivers.at[1].set(graph.receivers[0]).at[-4:].set(0))

    def fn(g, w):
        h, r = g.nodes["h"], g.receivers
        msg = jnp.tanh(0.25 * (h[g.senders] * w + h[r]))  # unsaturated: tanh' = 1 − tanh² keeps its precision
        n = h.shape[0]
        return msg, (jax.ops.segment_sum(msg, r, n), jraph.segment_mean(msg, r, n), jax.ops.segment_max(msg, r, n))

    w = jnp.asarray(rng.normal(size=(6,)), jnp.float32)
    compiled = jgnn.compile(fn, backend=backend)
    report = jgnn.explain(compiled, graph, w)
    assert set(report.codes(Pass.FUSE, applied=True)) == {Reason.FUSED_COMPUTE, Reason.MESSAGES_STORED_ANYWAY}
    assert report.codes(Pass.FUSE, applied=True).count(Reason.MESSAGES_STORED_ANYWAY) == 3
    check_against_reference(compiled, jax.jit(fn), graph, w, seed=SEED)


def test_nested_compilation_keeps_inner_fused_ops_whole():
    from models import make_gat

    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 16, 60, 7)
    phi, rho, psi = make_gat(rng, 7)[:3]
    inner = jgnn.message_passing(phi, rho, psi, backend="xla")
    reference = jgnn.message_passing(phi, rho, psi, backend="reference")

    def model(g, layer):
        h = layer(g).nodes["h"]
        return jnp.tanh(h) @ jnp.ones((h.shape[-1], 3))

    outer = jgnn.compile(lambda g: model(g, inner), backend="xla")
    report = jgnn.explain(outer, graph)
    assert not report.fallbacks
    assert [(k.op, k.backend) for k in report.kernels] == [("attention", "xla")]
    np.testing.assert_allclose(outer(graph), model(graph, reference), **TOL)
    grads = [jax.grad(lambda h, f=f: jnp.sum(f(graph._replace(nodes={"h": h}))))(graph.nodes["h"])
             for f in (outer, lambda g: model(g, reference))]
    np.testing.assert_allclose(*grads, **TOL)


def test_nested_compilation_of_a_typed_layer_with_pair_tables():
    from models import make_hgt

    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 20, 120, 7, node_types=2, edge_types=3)
    layout = GraphLayout.from_graph(graph)
    phi, rho, psi = make_hgt(rng, 7)
    inner = jgnn.message_passing(phi, rho, psi, backend="xla")
    reference = jgnn.message_passing(phi, rho, psi, backend="reference")

    def model(g, lay, layer):  # the inner layer makes per-(source, edge type) tables: the outer sees them whole
        return jnp.tanh(layer(g, layout=lay).nodes["h"]) @ jnp.ones((6, 3))

    outer = jgnn.compile(lambda g, lay: model(g, lay, inner), backend="xla")
    assert not jgnn.explain(outer, graph, layout).fallbacks
    np.testing.assert_allclose(outer(graph, layout), model(graph, None, reference), **TOL)

    def loss(h, f):
        return jnp.sum(jnp.sin(f(graph._replace(nodes={**graph.nodes, "h": h}))))

    np.testing.assert_allclose(jax.grad(loss)(graph.nodes["h"], lambda g: outer(g, layout)),
                               jax.grad(loss)(graph.nodes["h"], lambda g: model(g, None, reference)), **TOL)


def test_scores_unsafe_on_padded_lanes_stay_on_xla():
    rng = np.random.default_rng(SEED)
    graph = random_graph(rng, 14, 50, 7)

    def phi(s, d, e):  # exp(0) = 1 on a padded lane would enter the sum: not safe for the Pallas kernel
        return {"score": jnp.sum(jnp.exp(0.1 * s["h"] * d["h"]), -1, keepdims=True), "v": s["h"]}

    def rho(mb, node):
        return {"h": jgnn.sum(jgnn.softmax(mb["score"]) * mb["v"])}

    layer = jgnn.message_passing(phi, rho, backend="pallas_interpret")
    kernel = {k.op: k for k in jgnn.explain(layer, graph).kernels}["attention"]
    assert (kernel.lowering, kernel.code) == ("segment", Reason.NOT_ZERO_PADDING_SAFE)
    reference = jgnn.message_passing(phi, rho, backend="reference")
    np.testing.assert_allclose(layer(graph).nodes["h"], reference(graph).nodes["h"], **TOL)
