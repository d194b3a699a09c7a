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
    return graph


def _mlp(width):
    return nn.Sequential([nn.Dense(width), nn.relu, nn.Dense(width)])


# name -> (constructor(backend) -> module, graph kwargs, graph transform, expected output width)
CASES = {
    "gcn": (lambda b: jnn.GCNConv(5, backend=b), {}, homogeneous, 5),
    "gcn_plain": (lambda b: jnn.GCNConv(5, add_self_loops=False, normalize=False, backend=b), {}, homogeneous, 5),
    "gat": (lambda b: jnn.GATConv(4, num_heads=3, backend=b), {}, homogeneous, 12),
    "gat_mean": (lambda b: jnn.GATConv(4, num_heads=3, concat=False, add_self_loops=False, backend=b), {},
                 homogeneous, 4),
}


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
    for backend in ("reference", "xla"):
        module = CASES[name][0](backend)
        out = _features(module.apply(params, graph))
        weights = jnp.asarray(np.random.default_rng(7).normal(size=out.shape), out.dtype)
        grads = jax.grad(_loss)(params, module, graph, weights, mask)
        results[backend] = (np.asarray(out)[mask], grads)
    np.testing.assert_allclose(results["xla"][0], results["reference"][0], rtol=RTOL, atol=ATOL)
    jax.tree_util.tree_map(functools.partial(np.testing.assert_allclose, rtol=RTOL, atol=ATOL),
                           results["xla"][1], results["reference"][1])
    assert np.all(np.isfinite(results["xla"][0]))


@pytest.mark.parametrize("name", _cases())
def test_output_width(name):
    graph = _make_graph(name, seed=3)
    out = CASES[name][0]("xla").apply(_params(name, graph), graph)
    assert _features(out).shape == (int(graph.n_node.sum()), CASES[name][3])
    if isinstance(graph.nodes, dict):
        assert isinstance(out.nodes, dict) and "type" in out.nodes


@pytest.mark.parametrize("name", _cases())
def test_jit_grad_matches_eager(name):
    graph = _make_graph(name, seed=5)
    params = _params(name, graph)
    module = CASES[name][0]("xla")
    weights = jnp.ones((int(graph.n_node.sum()), CASES[name][3]))
    mask = np.ones(weights.shape[0], bool)
    eager = jax.grad(_loss)(params, module, graph, weights, mask)
    jitted = jax.jit(jax.grad(_loss), static_argnums=1)(params, module, graph, weights, mask)
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
