"""`jgnn.nn` modules: the compiled path (backend="xla") equals the reference program, outputs and gradients."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from graph_cases import pad, random_graph, real_nodes

from jgnn import nn as jnn

RTOL = ATOL = 1e-5
D = 6


def homogeneous(graph):
    return graph._replace(nodes=graph.nodes["h"], edges=None)


def typed(graph):
    return graph._replace(edges={"type": graph.edges["type"]})


def typed_ids(graph):
    n = graph.nodes["h"].shape[0]
    return typed(graph)._replace(nodes={"h": jnp.arange(n, dtype=jnp.int32), "type": graph.nodes["type"]})


def _mlp(width):
    return nn.Sequential([nn.Dense(width), nn.relu, nn.Dense(width)])


TYPED = {"node_types": 3, "edge_types": 4}

# name -> (constructor(backend) -> module, graph kwargs, graph transform, expected output width)
CASES = {
    "gcn": (lambda b: jnn.GCNConv(5, backend=b), {}, homogeneous, 5),
    "gcn_plain": (lambda b: jnn.GCNConv(5, add_self_loops=False, normalize=False, backend=b), {}, homogeneous, 5),
    "gat": (lambda b: jnn.GATConv(4, num_heads=3, backend=b), {}, homogeneous, 12),
    "gat_mean": (lambda b: jnn.GATConv(4, num_heads=3, concat=False, add_self_loops=False, backend=b), {},
                 homogeneous, 4),
    "gatv2": (lambda b: jnn.GATv2Conv(4, num_heads=2, backend=b), {}, homogeneous, 8),
    "sage_mean": (lambda b: jnn.SAGEConv(5, backend=b), {}, homogeneous, 5),
    "sage_max": (lambda b: jnn.SAGEConv(5, aggr="max", normalize=True, backend=b), {}, homogeneous, 5),
    "gin": (lambda b: jnn.GINConv(_mlp(5), eps=0.1, train_eps=True, backend=b), {}, homogeneous, 5),
    "edge_conv": (lambda b: jnn.EdgeConv(_mlp(5), backend=b), {}, homogeneous, 5),
    "rgcn": (lambda b: jnn.RGCNConv(5, 4, backend=b), TYPED, typed, 5),
    "rgcn_bases": (lambda b: jnn.RGCNConv(5, 4, num_bases=2, backend=b), TYPED, typed, 5),
    "rgcn_ids": (lambda b: jnn.RGCNConv(5, 4, num_bases=3, input_dim=16, backend=b), TYPED, typed_ids, 5),
    "rgat": (lambda b: jnn.RGATConv(3, 4, num_heads=2, backend=b), TYPED, typed, 6),
    "rgat_mean": (lambda b: jnn.RGATConv(3, 4, num_heads=2, concat=False, add_self_loops=False, backend=b),
                  TYPED, typed, 3),
    "hgt": (lambda b: jnn.HGTConv(D, 2, 3, 4, backend=b), TYPED, typed, D),
    "hgt_wide": (lambda b: jnn.HGTConv(8, 4, 3, 4, backend=b), TYPED, typed, 8),
}
TYPED_NAMES = [k for k, v in CASES.items() if v[1] is TYPED]


def _cases():
    return sorted(CASES)


def _params(name, graph):
    module = CASES[name][0]("reference")
    return module.init({"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}, graph)


def _features(out):
    return out.nodes["h"] if isinstance(out.nodes, dict) else out.nodes


def _make_graph(name, seed, padded=False):
    _, kwargs, transform, _ = CASES[name]
    graph = transform(random_graph(np.random.default_rng(seed), 13, 40, D, **kwargs))
    return pad(graph) if padded else graph


def _loss(params, module, graph, weights, mask):
    out = _features(module.apply(params, graph))
    return jnp.sum(jnp.where(mask[:, None], out * weights, 0.0))


@pytest.mark.parametrize("padded", [False, True], ids=["plain", "padded"])
@pytest.mark.parametrize("name", _cases())
def test_compiled_matches_reference(name, padded):
    graph = _make_graph(name, seed=hash(name) % 1000, padded=padded)
    params = _params(name, graph)
    mask = real_nodes(graph) if padded else np.ones(graph.n_node.sum(), bool)
    results = {}
    weights = jnp.asarray(np.random.default_rng(7).normal(size=(mask.shape[0], CASES[name][3])), jnp.float32)
    for backend in ("reference", "xla"):
        module = CASES[name][0](backend)

        def loss(p, g, module=module):
            out = _features(module.apply(p, g))
            return jnp.sum(jnp.where(mask[:, None], out * weights, 0.0)), out

        (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, graph)
        results[backend] = (np.asarray(out)[mask], grads)
    assert out.shape == (mask.shape[0], CASES[name][3])  # PyG output widths
    np.testing.assert_allclose(results["xla"][0], results["reference"][0], rtol=RTOL, atol=ATOL)
    jax.tree_util.tree_map(functools.partial(np.testing.assert_allclose, rtol=RTOL, atol=ATOL),
                           results["xla"][1], results["reference"][1])
    assert np.all(np.isfinite(results["xla"][0]))


@pytest.mark.parametrize("name", ["gcn", "gat", "edge_conv", "rgcn_ids"])
def test_eager_grad_matches_jit(name):
    graph = _make_graph(name, seed=5)
    params = _params(name, graph)
    module = CASES[name][0]("xla")
    weights = jnp.ones((int(graph.n_node.sum()), CASES[name][3]))
    mask = np.ones(weights.shape[0], bool)
    out = module.apply(params, graph)
    if isinstance(graph.nodes, dict):
        assert isinstance(out.nodes, dict) and "type" in out.nodes
    eager = jax.grad(_loss)(params, module, graph, weights, mask)
    jitted = jax.jit(jax.grad(lambda p, g: _loss(p, module, g, weights, mask)))(params, graph)
    jax.tree_util.tree_map(functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-5), jitted, eager)


def test_gcn_matches_dense_formula():
    graph = _make_graph("gcn", seed=11)
    params = _params("gcn", graph)
    out = jnn.GCNConv(5, backend="xla").apply(params, graph).nodes
    n = graph.nodes.shape[0]
    a = np.zeros((n, n))
    np.add.at(a, (np.asarray(graph.receivers), np.asarray(graph.senders)), 1.0)
    a += np.eye(n)
    d = a.sum(1)
    norm = a / np.sqrt(d[:, None] * d[None, :])
    p = params["params"]
    expected = norm @ (np.asarray(graph.nodes) @ np.asarray(p["kernel"])) + np.asarray(p["bias"])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_gat_attention_dropout_needs_rng_and_changes_output():
    graph = _make_graph("gat", seed=2)
    module = jnn.GATConv(4, num_heads=2, attention_dropout=0.5, dropout=0.5, backend="xla")
    params = module.init(jax.random.PRNGKey(0), graph)
    base = module.apply(params, graph).nodes
    a = module.apply(params, graph, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)}).nodes
    b = module.apply(params, graph, deterministic=False, rngs={"dropout": jax.random.PRNGKey(2)}).nodes
    assert not np.allclose(a, base) and not np.allclose(a, b)
    ref = jnn.GATConv(4, num_heads=2, attention_dropout=0.5, dropout=0.5, backend="reference")
    r = ref.apply(params, graph, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)}).nodes
    np.testing.assert_allclose(a, r, rtol=RTOL, atol=ATOL)


def test_add_self_loops_keeps_padding_contiguous():
    graph = pad(homogeneous(random_graph(np.random.default_rng(0), 13, 40, D, n_graphs=3)))
    looped = jnn.add_self_loops(graph)
    assert int(looped.n_edge.sum()) == looped.senders.shape[0] == graph.senders.shape[0] + graph.nodes.shape[0]
    node_graph = np.repeat(np.arange(len(graph.n_node)), np.asarray(graph.n_node))
    edge_graph = np.repeat(np.arange(len(looped.n_edge)), np.asarray(looped.n_edge))
    np.testing.assert_array_equal(node_graph[np.asarray(looped.senders)], edge_graph)
    np.testing.assert_array_equal(node_graph[np.asarray(looped.receivers)], edge_graph)


@pytest.mark.parametrize("name", TYPED_NAMES)
def test_typed_modules_reject_untyped_graphs(name):
    graph = _make_graph(name, seed=1)
    params = _params(name, graph)
    module = CASES[name][0]("xla")
    with pytest.raises(ValueError, match='"type"'):
        module.apply(params, graph._replace(edges=None))
    with pytest.raises(ValueError, match='"type"'):
        module.apply(params, graph._replace(nodes={"h": graph.nodes["h"]}))


def test_pyg_widths():
    graph = _make_graph("gat", seed=4)
    for module, width in [(jnn.GATConv(8, num_heads=8), 64), (jnn.GATConv(7, num_heads=1, concat=False), 7),
                          (jnn.GATv2Conv(3, num_heads=4, concat=False), 3), (jnn.GCNConv(16), 16)]:
        out = module.apply(module.init(jax.random.PRNGKey(0), graph), graph).nodes
        assert out.shape == (graph.nodes.shape[0], width)
    typed_graph = _make_graph("hgt", seed=4)
    hgt = jnn.HGTConv(16, 4, 3, 4)
    out = hgt.apply(hgt.init(jax.random.PRNGKey(0), typed_graph), typed_graph).nodes
    assert out["h"].shape == (13, 16)
    np.testing.assert_array_equal(out["type"], typed_graph.nodes["type"])
    with pytest.raises(ValueError, match="divisible"):
        jnn.HGTConv(10, 4, 3, 4).init(jax.random.PRNGKey(0), typed_graph)


def test_rgcn_ids_equal_one_hot_features():
    graph = _make_graph("rgcn_ids", seed=9)
    module = jnn.RGCNConv(5, 4, num_bases=3, input_dim=13, backend="xla")
    params = module.init(jax.random.PRNGKey(0), graph)
    one_hot = graph._replace(nodes={**graph.nodes, "h": jax.nn.one_hot(graph.nodes["h"], 13)})
    dense = jnn.RGCNConv(5, 4, num_bases=3, backend="xla")
    np.testing.assert_allclose(module.apply(params, graph).nodes["h"], dense.apply(params, one_hot).nodes["h"],
                               rtol=1e-5, atol=1e-5)


def test_rgcn_matches_per_relation_mean():
    graph = _make_graph("rgcn", seed=12)
    module = jnn.RGCNConv(5, 4, backend="xla")
    params = module.init(jax.random.PRNGKey(0), graph)
    out = np.asarray(module.apply(params, graph).nodes["h"])
    p = jax.tree_util.tree_map(np.asarray, params["params"])
    x, s, r, t = (np.asarray(a) for a in (graph.nodes["h"], graph.senders, graph.receivers, graph.edges["type"]))
    expected = x @ p["root"] + p["bias"]
    for i in range(x.shape[0]):
        for rel in range(4):
            sel = (r == i) & (t == rel)
            if sel.any():
                expected[i] += (x[s[sel]] @ p["kernel"][rel]).mean(0)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
