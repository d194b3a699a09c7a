"""`jgnn.nn` modules: every backend equals the reference program (outputs and gradients, under jit), a layout
changes nothing, and the modules' own rules (self-loops, layouts, dtypes, errors) hold."""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np
import pytest
from graph_cases import pad, random_graph, real_nodes

from jgnn import nn as jnn
from jgnn.layout import GraphLayout

RTOL = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}
D, D_EDGE, R, NODE_TYPES = 6, 3, 4, 3


def _with_loops(graph: jraph.GraphsTuple) -> jraph.GraphsTuple:
    """Make the first two edges of every graph the same self-loop (an existing, duplicated loop)."""
    senders, receivers = np.array(graph.senders), np.array(graph.receivers)
    starts = np.concatenate([[0], np.cumsum(graph.n_edge)[:-1]])
    for s in starts[np.asarray(graph.n_edge) >= 2]:
        senders[s:s + 2] = receivers[s:s + 2] = receivers[s]
    return graph._replace(senders=jnp.asarray(senders), receivers=jnp.asarray(receivers))


def make_graph(kind: str, seed: int, padded: bool = False) -> jraph.GraphsTuple:
    """A batch of 2 graphs (13 nodes, 40 edges) with existing self-loops, duplicate edges, isolated nodes."""
    rng = np.random.default_rng(seed)
    typed = kind.startswith("typed")
    g = _with_loops(random_graph(rng, 13, 40, D, d_edge=D_EDGE, n_graphs=2, node_types=NODE_TYPES if typed else 0,
                                 edge_types=R if typed else 0))
    weight = jnp.asarray(rng.uniform(0.5, 2.0, 40), jnp.float32)
    x, attr = g.nodes["h"], g.edges["x"]
    g = {
        "x": lambda: g._replace(nodes=x, edges=None),
        "x_weight": lambda: g._replace(nodes=x, edges=weight),
        "x_attr": lambda: g._replace(nodes=x, edges=attr),
        "typed": lambda: g._replace(edges={"type": g.edges["type"]}),
        "typed_attr": lambda: g._replace(edges={"type": g.edges["type"], "h": attr}),
        "typed_ids": lambda: g._replace(nodes={"h": jnp.arange(13, dtype=jnp.int32), "type": g.nodes["type"]},
                                        edges={"type": g.edges["type"]}),
    }[kind]()
    return pad(g) if padded else g


def _mlp(width):
    return nn.Sequential([nn.Dense(width), nn.relu, nn.Dense(width)])


MULT = "multiplicative-self-attention"
# name -> (constructor(backend) -> module, graph kind, output width)
CASES = {
    "gcn": (lambda b: jnn.GCNConv(5, backend=b), "x_weight", 5),
    "gcn_plain": (lambda b: jnn.GCNConv(5, normalize=False, backend=b), "x", 5),
    "gat": (lambda b: jnn.GATConv(4, num_heads=3, backend=b), "x", 12),
    "gat_edge_residual": (lambda b: jnn.GATConv(4, 2, edge_dim=D_EDGE, residual=True, backend=b), "x_attr", 8),
    "gat_mean_no_loops": (lambda b: jnn.GATConv(4, 3, concat=False, add_self_loops=False, backend=b), "x", 4),
    "gatv2_edge": (lambda b: jnn.GATv2Conv(4, 2, edge_dim=D_EDGE, fill_value="max", backend=b), "x_attr", 8),
    "sage_mean": (lambda b: jnn.SAGEConv(5, backend=b), "x", 5),
    "sage_max_project": (lambda b: jnn.SAGEConv(5, aggr="max", normalize=True, project=True, backend=b), "x", 5),
    "graph_conv_mean": (lambda b: jnn.GraphConv(5, aggr="mean", backend=b), "x_weight", 5),
    "gin": (lambda b: jnn.GINConv(_mlp(5), eps=0.1, train_eps=True, backend=b), "x", 5),
    "gine": (lambda b: jnn.GINEConv(_mlp(5), edge_dim=D_EDGE, backend=b), "x_attr", 5),
    "edge_conv": (lambda b: jnn.EdgeConv(_mlp(5), backend=b), "x", 5),
    "transformer": (lambda b: jnn.TransformerConv(3, 2, edge_dim=D_EDGE, beta=True, backend=b), "x_attr", 6),
    "cheb": (lambda b: jnn.ChebConv(5, K=3, backend=b), "x_weight", 5),
    "appnp": (lambda b: jnn.APPNP(3, 0.1, backend=b), "x_weight", D),
    "pna": (lambda b: jnn.PNAConv(6, ("mean", "max", "std"), ("identity", "amplification"), (1, 2, 3, 2),
                                  edge_dim=D_EDGE, towers=2, backend=b), "x_attr", 6),
    "rgcn": (lambda b: jnn.RGCNConv(5, R, backend=b), "typed", 5),
    "rgcn_bases": (lambda b: jnn.RGCNConv(5, R, num_bases=2, backend=b), "typed", 5),
    "rgcn_ids": (lambda b: jnn.RGCNConv(5, R, num_bases=3, input_dim=16, backend=b), "typed_ids", 5),
    "rgcn_blocks_max": (lambda b: jnn.RGCNConv(6, R, num_blocks=2, aggr="max", backend=b), "typed", 6),
    "rgat": (lambda b: jnn.RGATConv(3, R, num_heads=2, backend=b), "typed", 6),
    "rgat_within_mult_scaled": (lambda b: jnn.RGATConv(3, R, 2, dim=2, attention_mode=MULT, mod="scaled",
                                                       attention_mechanism="within-relation", edge_dim=D_EDGE,
                                                       backend=b), "typed_attr", 12),
    "rgat_loops_mean": (lambda b: jnn.RGATConv(3, R, 2, concat=False, add_self_loops=True, backend=b), "typed", 3),
    "hgt": (lambda b: jnn.HGTConv(D, 2, NODE_TYPES, R, backend=b), "typed", D),
    "hgt_in_features": (lambda b: jnn.HGTConv(D, 2, NODE_TYPES, R, in_features={0: 4, 1: D, 2: 5}, backend=b),
                        "typed", D),
}
ADDS_LOOPS = {"gcn", "gat", "gat_edge_residual", "gatv2_edge", "appnp", "rgat_loops_mean"}


def _params(name, graph):
    module = CASES[name][0]("reference")
    return module.init({"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}, graph)


def _features(out):
    return out.nodes["h"] if isinstance(out.nodes, dict) else out.nodes


def _layout(name, graph, padded=False):
    return GraphLayout.from_graph(graph, padded=padded, self_loops=name in ADDS_LOOPS)


def _run(name, backend, graph, params, mask, layout=None):
    """jit(value_and_grad) of a weighted sum of the real nodes' outputs: (outputs on real nodes, gradients)."""
    module = CASES[name][0](backend)
    weights = jnp.asarray(np.random.default_rng(7).normal(size=(mask.shape[0], CASES[name][2])), jnp.float32)

    def loss(p, g, lay):
        out = _features(module.apply(p, g, layout=lay))
        return jnp.sum(jnp.where(mask[:, None], out * weights, 0.0)), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, graph, layout)
    return np.asarray(out)[mask], grads


def _assert_close(actual, expected, rtol=1e-5):
    jax.tree_util.tree_map(functools.partial(np.testing.assert_allclose, rtol=rtol, atol=rtol), actual, expected)


BACKEND_CASES = [pytest.param(name, backend, id=f"{name}-{backend}")
                 for name in sorted(CASES) for backend in ("xla", "pallas_interpret")]


@pytest.mark.parametrize("name,backend", BACKEND_CASES)
def test_backend_matches_reference_with_and_without_layout(name, backend):
    graph = make_graph(CASES[name][1], seed=sum(map(ord, name)))
    params = _params(name, graph)
    mask = np.ones(int(np.sum(graph.n_node)), bool)
    layout = _layout(name, graph)
    expected = _run(name, "reference", graph, params, mask, layout=layout)  # the reference reads no layout
    assert expected[0].shape == (mask.shape[0], CASES[name][2])
    assert np.all(np.isfinite(expected[0]))
    _assert_close(_run(name, backend, graph, params, mask), expected)
    _assert_close(_run(name, backend, graph, params, mask, layout=layout), expected)


def _float_leaves_tangent(tree, seed):
    """A seeded random tangent for every floating leaf of ``tree`` (integer leaves: float0 zeros, as JAX wants)."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    rng = np.random.default_rng(seed)
    tangent = [jnp.asarray(rng.normal(size=np.shape(x)), x.dtype) if jnp.issubdtype(x.dtype, jnp.floating)
               else np.zeros(np.shape(x), jax.dtypes.float0) for x in leaves]
    return jax.tree_util.tree_unflatten(treedef, tangent)


@pytest.mark.parametrize("name,backend", [
    pytest.param(name, backend, id=f"{name}-{backend}", marks=[pytest.mark.slow] if backend != "xla" else [])
    for name in sorted(CASES) for backend in ("xla", "pallas_interpret")])
def test_forward_mode_matches_reference(name, backend):
    """``jax.jvp`` through the layer, along random tangents of every parameter, node feature and edge feature,
    equals the reference's (forward mode through every `jgnn.nn` layer; Pallas interpret in the slow tier)."""
    graph = make_graph(CASES[name][1], seed=sum(map(ord, name)) + 1)
    params = _params(name, graph)
    inputs = (params, graph.nodes, graph.edges)
    tangents = _float_leaves_tangent(inputs, seed=3)

    def forward(backend):
        module = CASES[name][0](backend)
        return jax.jit(lambda p, nodes, edges: _features(module.apply(p, graph._replace(nodes=nodes, edges=edges))))

    out, tangent_out = jax.jvp(forward(backend), inputs, tangents)
    want, want_tangent = jax.jvp(forward("reference"), inputs, tangents)
    assert np.all(np.isfinite(want_tangent)) and np.abs(want_tangent).max() > 1e-3
    _assert_close((out, tangent_out), (want, want_tangent))


@pytest.mark.parametrize("name", ["gcn", "gat", "rgcn", "cheb"])
def test_padded_batches(name):
    """jraph padding: the padding graph changes nothing on real nodes, with a padded layout too."""
    graph = make_graph(CASES[name][1], seed=3, padded=True)
    params = _params(name, graph)
    mask = real_nodes(graph)
    expected = _run(name, "reference", graph, params, mask)
    _assert_close(_run(name, "xla", graph, params, mask, layout=_layout(name, graph, padded=True)), expected)


@pytest.mark.parametrize("name", ["gcn", "rgcn_ids"])
def test_eager_grad_matches_jit(name):
    graph = make_graph(CASES[name][1], seed=5)
    params = _params(name, graph)
    module = CASES[name][0]("xla")
    loss = lambda p, g: jnp.sum(_features(module.apply(p, g)))
    out = module.apply(params, graph)
    if isinstance(graph.nodes, dict):
        assert isinstance(out.nodes, dict) and "type" in out.nodes
    _assert_close(jax.jit(jax.grad(loss))(params, graph), jax.grad(loss)(params, graph), rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------
# self-loops and layouts


def test_layout_with_self_loops_describes_add_self_loops():
    """``GraphLayout.from_graph(g, self_loops=True)`` is the layout of ``add_self_loops(g)`` (one loop order); on a
    padded graph the padding graph's loops are padding too."""
    import pallas_kernels as pk

    graph = pad(make_graph("x", seed=0))
    looped = jnn.add_self_loops(graph)
    actual = GraphLayout.from_graph(graph, padded=True, self_loops=True)
    valid = np.concatenate([np.asarray(jraph.get_edge_padding_mask(graph)),
                            np.asarray(jraph.get_node_padding_mask(graph))])
    csr, rev = pk.build_csr_numpy(np.asarray(looped.senders), np.asarray(looped.receivers), graph.nodes.shape[0],
                                  valid)
    assert actual.self_loops
    jax.tree_util.tree_map(np.testing.assert_array_equal, (actual.csr, actual.rev_csr), (csr, rev))


def test_layout_self_loops_is_static_under_jit():
    graph = make_graph("x", seed=1)
    layout = GraphLayout.from_graph(graph, self_loops=True)
    assert all(isinstance(leaf, np.ndarray | jax.Array) for leaf in jax.tree_util.tree_leaves(layout))
    flag = jax.jit(lambda lay: jnp.asarray(lay.self_loops))(layout)
    assert bool(flag)


@pytest.mark.parametrize("name,adds", [("gcn", True), ("gat", True), ("appnp", True), ("sage_mean", False),
                                       ("rgat", False), ("rgat_loops_mean", True)])
def test_layout_must_match_self_loops(name, adds):
    graph = make_graph(CASES[name][1], seed=2)
    params = _params(name, graph)
    module = CASES[name][0]("xla")
    wrong = GraphLayout.from_graph(graph, self_loops=not adds)
    with pytest.raises(ValueError, match=f"self_loops={not adds}"):
        module.apply(params, graph, layout=wrong)


def test_gcn_replaces_existing_self_loops():
    """PyG semantics, checked against the dense formula: loops are replaced, not added to."""
    graph = make_graph("x", seed=11)
    params = _params("gcn_plain", graph)
    out = jnn.GCNConv(5, backend="xla").apply(params, graph).nodes
    n = graph.nodes.shape[0]
    a = np.zeros((n, n))
    np.add.at(a, (np.asarray(graph.receivers), np.asarray(graph.senders)), 1.0)
    np.fill_diagonal(a, 1.0)  # an existing loop keeps weight 1; one loop per node
    d = a.sum(1)
    norm = a / np.sqrt(d[:, None] * d[None, :])
    p = params["params"]
    expected = norm @ (np.asarray(graph.nodes) @ np.asarray(p["kernel"])) + np.asarray(p["bias"])
    assert np.any(np.asarray(graph.senders) == np.asarray(graph.receivers))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


LOOP_FREE_LAYERS = {"gcn": lambda: jnn.GCNConv(5, backend="xla"),
                    "gat": lambda: jnn.GATConv(4, num_heads=2, backend="xla"),
                    "gatv2": lambda: jnn.GATv2Conv(4, num_heads=2, backend="xla")}


@pytest.mark.parametrize("loops", [False, True])
@pytest.mark.parametrize("name", sorted(LOOP_FREE_LAYERS))
def test_a_layout_of_a_loop_free_graph_skips_the_loop_replacement(name, loops):
    """A layout records whether the graph has its own self-loops (padding edges count). Without any, GCN's
    normalisation skips PyG's loop replacement (no per-edge weights, flags or selects, only ``d_j^-1/2 d_i^-1/2``)
    and GAT/GATv2 append one loop per node without the flag that masks existing ones (no select of the scores):
    no ``senders == receivers`` at all. Outputs and gradients (and attention weights) are those of the layer
    without a layout; with loops, the layout changes nothing."""
    graph = make_graph("x", seed=11)
    if not loops:
        keep = np.asarray(graph.senders) != np.asarray(graph.receivers)
        graph = graph._replace(senders=graph.senders[keep], receivers=graph.receivers[keep],
                               edges=jax.tree.map(lambda e: e[keep], graph.edges),
                               n_edge=jnp.asarray([int(k.sum()) for k in np.split(keep, np.cumsum(graph.n_edge)[:-1])],
                                                  graph.n_edge.dtype))
    layout = GraphLayout.from_graph(graph, self_loops=True)
    assert layout.own_loops is loops
    assert GraphLayout.from_graph(pad(graph), padded=True).own_loops  # jraph pads with loops on the padding node
    module = LOOP_FREE_LAYERS[name]()
    params = module.init(jax.random.key(0), graph)
    with_layout = lambda p, x: module.apply(p, graph._replace(nodes=x), layout=layout).nodes
    without = lambda p, x: module.apply(p, graph._replace(nodes=x)).nodes
    x = graph.nodes
    np.testing.assert_allclose(with_layout(params, x), without(params, x), rtol=1e-5, atol=1e-6)
    loss = lambda f: lambda p, x: jnp.sum(jnp.sin(f(p, x)))
    for a, b in zip(jax.tree.leaves(jax.grad(loss(with_layout), argnums=(0, 1))(params, x)),
                    jax.tree.leaves(jax.grad(loss(without), argnums=(0, 1))(params, x)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    if name != "gcn":
        (_, wa), (_, wb) = (module.apply(params, graph, layout=lay, return_attention_weights=True)
                            for lay in (layout, None))
        np.testing.assert_allclose(wa[1], wb[1], rtol=1e-5, atol=1e-6)
    compares = [e for e in jax.make_jaxpr(with_layout)(params, x).eqns if e.primitive.name == "eq"
                and e.outvars[0].aval.shape == graph.senders.shape]
    assert bool(compares) is loops  # senders == receivers is looked for only where loops may exist


def test_gat_attention_weights_mask_existing_loops():
    graph = make_graph("x", seed=4)
    module = jnn.GATConv(4, num_heads=2, backend="xla")
    params = module.init(jax.random.PRNGKey(0), graph)
    out, att = module.apply(params, graph, return_attention_weights=True)
    e, n = graph.senders.shape[0], graph.nodes.shape[0]
    assert att.weights.shape == (e + n, 2)
    weights, receivers = np.asarray(att.weights), np.asarray(att.receivers)
    existing = np.asarray(graph.senders == graph.receivers)
    assert existing.sum() >= 2
    # every node's weights sum to one per head; masked existing loops weigh nothing
    np.testing.assert_allclose(jax.ops.segment_sum(weights, receivers, n), np.ones((n, 2)), rtol=1e-5)
    assert int(np.sum(np.all(weights == 0, axis=1))) == existing.sum()
    np.testing.assert_allclose(out.nodes, module.apply(params, graph).nodes, rtol=1e-6)


def test_add_self_loops_appends_one_loop_per_node_after_every_edge():
    """Loops follow all edges (no permutation the compiler cannot see through); each joins a node to itself, so a
    padding graph's loops stay among its padding nodes."""
    graph = pad(make_graph("x", seed=0))
    looped = jnn.add_self_loops(graph)
    n, e = graph.nodes.shape[0], graph.senders.shape[0]
    assert int(looped.n_edge.sum()) == looped.senders.shape[0] == e + n
    np.testing.assert_array_equal(looped.senders[:e], graph.senders)
    np.testing.assert_array_equal(looped.senders[e:], np.arange(n))
    np.testing.assert_array_equal(looped.receivers[e:], np.arange(n))


# ---------------------------------------------------------------------------------------------------------
# bipartite inputs


@pytest.mark.parametrize("make", [lambda b: jnn.SAGEConv(5, backend=b), lambda b: jnn.GraphConv(5, backend=b),
                                  lambda b: jnn.TransformerConv(3, 2, backend=b)],
                         ids=["sage", "graph_conv", "transformer"])
def test_bipartite_equals_union_graph_on_every_backend(make):
    """With equal widths, ``(x_src, x_dst)`` gives the destination rows of the same layer run on one graph that
    holds both node sets (sources first)."""
    rng = np.random.default_rng(0)
    xs, xd = (jnp.asarray(rng.normal(size=(k, D)), jnp.float32) for k in (9, 6))
    s, r = rng.integers(0, 9, 30).astype(np.int32), rng.integers(0, 6, 30).astype(np.int32)
    bip = jraph.GraphsTuple(nodes=(xs, xd), edges=None, senders=jnp.asarray(s), receivers=jnp.asarray(r),
                            n_node=jnp.asarray([15]), n_edge=jnp.asarray([30]), globals=None)
    union = bip._replace(nodes=jnp.concatenate([xs, xd]), receivers=jnp.asarray(r + 9))
    module = make("reference")
    params = module.init(jax.random.PRNGKey(0), union)
    expected = np.asarray(module.apply(params, union).nodes)[9:]
    for backend in ("reference", "xla", "pallas_interpret"):
        out = module.clone(backend=backend).apply(params, bip).nodes
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5, err_msg=backend)


def test_bipartite_rejects_a_layout_and_bad_indices():
    rng = np.random.default_rng(0)
    bip = jraph.GraphsTuple(nodes=(jnp.ones((5, 3)), jnp.ones((4, 3))), edges=None,
                            senders=jnp.asarray([0, 4]), receivers=jnp.asarray([3, 4]), n_node=jnp.asarray([9]),
                            n_edge=jnp.asarray([2]), globals=None)
    module = jnn.SAGEConv(2)
    with pytest.raises(ValueError, match=r"out of range \[0, 4\)"):
        module.init(jax.random.PRNGKey(0), bip)
    ok = bip._replace(receivers=jnp.asarray([3, 0]))
    params = module.init(jax.random.PRNGKey(0), ok)
    layout = GraphLayout.from_graph(make_graph("x", seed=int(rng.integers(10))))
    with pytest.raises(ValueError, match="bipartite"):
        module.apply(params, ok, layout=layout)
    with pytest.raises(ValueError, match="bipartite"):
        jnn.GCNConv(2).init(jax.random.PRNGKey(0), ok)


# ---------------------------------------------------------------------------------------------------------
# dtypes, errors, shapes


def _in_dtype(module, dtype):
    """``module`` with ``dtype``/``param_dtype`` set, on the user's inner MLP too (GIN, GINE and EdgeConv leave
    theirs to the user, as Flax leaves a submodule passed in)."""
    inner = {"mlp": module.mlp.clone(layers=[layer.clone(dtype=dtype, param_dtype=dtype)
                                             if isinstance(layer, nn.Dense) else layer for layer in module.mlp.layers])
             } if hasattr(module, "mlp") else {}
    fields = {f.name for f in dataclasses.fields(module)}
    wanted = {"dtype": dtype, "param_dtype": dtype}
    return module.clone(**{k: v for k, v in wanted.items() if k in fields}, **inner)


@pytest.mark.parametrize("name", sorted(CASES))
def test_dtype_and_param_dtype(name):
    """Flax convention: ``param_dtype`` for parameters, ``dtype`` for the computation and the output."""
    graph = make_graph(CASES[name][1], seed=6)
    module = _in_dtype(CASES[name][0]("reference"), jnp.bfloat16)
    params = jax.jit(module.init)(jax.random.PRNGKey(0), graph)
    leaves = jax.tree_util.tree_leaves(params)
    assert name == "appnp" or leaves, "every module but APPNP has parameters"
    assert {leaf.dtype for leaf in leaves} <= {jnp.dtype(jnp.bfloat16)}
    out = _features(jax.jit(module.apply)(params, graph))
    assert out.dtype == jnp.bfloat16
    full = CASES[name][0]("reference")
    expected = _features(jax.jit(full.apply)(jax.tree_util.tree_map(lambda p: p.astype(jnp.float32), params),
                                             graph))
    np.testing.assert_allclose(np.asarray(out, np.float32), expected, rtol=0.1, atol=0.1)


@pytest.mark.parametrize("module,kind,match", [
    (jnn.SAGEConv(2, aggr="median"), "x", "aggr must be one of"),
    (jnn.GATConv(2, edge_dim=D_EDGE, fill_value="mul"), "x_attr", "fill_value must be one of"),
    (jnn.GATConv(2, edge_dim=D_EDGE), "x", "edge_dim=3 needs edge features"),
    (jnn.GATConv(2, edge_dim=5), "x_attr", "edge_dim=5 but the edge features have width 3"),
    (jnn.GINEConv(_mlp(2)), "x_attr", "set edge_dim"),
    (jnn.GCNConv(2, add_self_loops=True, normalize=False), "x", "needs normalize=True"),
    (jnn.RGCNConv(2, 2), "typed", r"outside \[0, 2\)"),
    (jnn.RGCNConv(2, R, num_bases=2, num_blocks=2), "typed", "exclusive"),
    (jnn.RGATConv(2, R, dim=2), "typed", "needs dim=1"),
    (jnn.RGATConv(2, R, mod="scaled", attention_dropout=0.1), "typed", "needs mod=None"),
    (jnn.PNAConv(4, ("mean",), ("cubic",), (1, 2)), "x", "scalers entry must be one of"),
    (jnn.ChebConv(2, K=0), "x", "K must be >= 1"),
    (jnn.HGTConv(D, 2, NODE_TYPES, R, in_features={0: 4}), "typed", "in_features must give a width"),
])
def test_bad_options_raise_clear_errors(module, kind, match):
    with pytest.raises(ValueError, match=match):
        module.init(jax.random.PRNGKey(0), make_graph(kind, seed=0))


@pytest.mark.parametrize("name", ["rgcn", "rgat", "hgt"])
def test_typed_modules_reject_graphs_without_edge_types(name):
    graph = make_graph(CASES[name][1], seed=1)
    params = _params(name, graph)
    module = CASES[name][0]("xla")
    with pytest.raises(ValueError, match='"type"'):
        module.apply(params, graph._replace(edges=None))
    if name == "hgt":  # the only one that reads node types
        with pytest.raises(ValueError, match='"type"'):
            module.apply(params, graph._replace(nodes={"h": graph.nodes["h"]}))


def test_gat_attention_dropout_needs_rng_and_changes_output():
    graph = make_graph("x", seed=2)
    module = jnn.GATConv(4, num_heads=2, attention_dropout=0.5, dropout=0.5, backend="xla")
    params = module.init(jax.random.PRNGKey(0), graph)
    base = module.apply(params, graph).nodes
    a = module.apply(params, graph, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)}).nodes
    b = module.apply(params, graph, deterministic=False, rngs={"dropout": jax.random.PRNGKey(2)}).nodes
    assert not np.allclose(a, base) and not np.allclose(a, b)
    ref = module.clone(backend="reference")
    r = ref.apply(params, graph, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)}).nodes
    np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)


def _out_shape(module, graph):
    """The output feature shape, from tracing alone (``jax.eval_shape``; nothing runs)."""
    params = jax.eval_shape(module.init, jax.random.PRNGKey(0), graph)
    return _features(jax.eval_shape(module.apply, params, graph)).shape


def test_pyg_widths():
    graph, typed_graph = make_graph("x", seed=4), make_graph("typed", seed=4)
    for module, width in [(jnn.GATConv(8, num_heads=8), 64), (jnn.GATConv(7, num_heads=1, concat=False), 7),
                          (jnn.GATv2Conv(3, num_heads=4, concat=False), 3), (jnn.GCNConv(16), 16),
                          (jnn.TransformerConv(3, 4), 12), (jnn.RGATConv(3, R, 2, dim=2, attention_mode=MULT), 12),
                          (jnn.HGTConv(16, 4, NODE_TYPES, R), 16)]:
        g = typed_graph if isinstance(module, jnn.RGATConv | jnn.HGTConv) else graph
        assert _out_shape(module.clone(backend="reference"), g) == (13, width)
    hgt = jnn.HGTConv(16, 4, NODE_TYPES, R, backend="reference")
    out = jax.eval_shape(hgt.apply, jax.eval_shape(hgt.init, jax.random.PRNGKey(0), typed_graph), typed_graph)
    assert set(out.nodes) == {"h", "type"}
    with pytest.raises(ValueError, match="divisible"):
        jnn.HGTConv(10, 4, NODE_TYPES, R).init(jax.random.PRNGKey(0), typed_graph)


def test_rgcn_ids_equal_one_hot_features():
    graph = make_graph("typed_ids", seed=9)
    module = jnn.RGCNConv(5, R, num_bases=3, input_dim=13, backend="xla")
    params = module.init(jax.random.PRNGKey(0), graph)
    one_hot = graph._replace(nodes={**graph.nodes, "h": jax.nn.one_hot(graph.nodes["h"], 13)})
    dense = jnn.RGCNConv(5, R, num_bases=3, backend="xla")
    np.testing.assert_allclose(module.apply(params, graph).nodes["h"], dense.apply(params, one_hot).nodes["h"],
                               rtol=1e-5, atol=1e-5)


def test_rgcn_matches_per_relation_mean_with_free_root():
    graph = make_graph("typed", seed=12)
    module = jnn.RGCNConv(5, R, num_bases=2, backend="xla")
    params = module.init(jax.random.PRNGKey(0), graph)
    out = np.asarray(module.apply(params, graph).nodes["h"])
    p = jax.tree_util.tree_map(np.asarray, params["params"])
    assert p["comp"].shape == (R, 2)  # the root weight is free, not one more basis combination (PyG)
    weight = np.einsum("rb,bio->rio", p["comp"], p["bases"])
    x, s, r, t = (np.asarray(a) for a in (graph.nodes["h"], graph.senders, graph.receivers, graph.edges["type"]))
    expected = x @ p["root"] + p["bias"]
    for i in range(x.shape[0]):
        for rel in range(R):
            sel = (r == i) & (t == rel)
            if sel.any():
                expected[i] += (x[s[sel]] @ weight[rel]).mean(0)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_every_layer_rejects_a_bad_backend_or_remat_when_built():
    """A `jgnn.nn` module with a ``backend`` option validates it (and ``remat``) at construction, as
    `jgnn.message_passing` does, not at ``init``."""
    import dataclasses
    import inspect

    from jgnn.nn import _utils

    modules = [obj for _, obj in inspect.getmembers(jnn, inspect.isclass)
               if issubclass(obj, nn.Module) and "backend" in {f.name for f in dataclasses.fields(obj)}]
    assert len(modules) >= 20
    assert [m.__name__ for m in modules if not issubclass(m, _utils.CheckedOptions)] == []
    for bad in ({"backend": "cuda"}, {"remat": "sometimes"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            jnn.GCNConv(3, **bad)
        with pytest.raises(ValueError, match=next(iter(bad))):
            jnn.GATConv(3, num_heads=2, **bad)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_graph_without_node_features_is_named(name):
    """A link-prediction graph often has ``nodes=None``: the error says so, not a shape or key error."""
    graph = make_graph(CASES[name][1], seed=1)._replace(nodes=None)
    with pytest.raises(ValueError, match="graph.nodes is None"):
        CASES[name][0]("xla").init(jax.random.key(0), graph)
