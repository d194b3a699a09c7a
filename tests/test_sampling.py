"""Neighbour sampling and ClusterGCN batches: sampled edges are real, fan-outs hold, padding never leaks into real
rows (a 2-layer SAGE on seeds equals the full graph), shapes are static, epochs are deterministic, and the
prefetch thread hands errors over and stops."""

from __future__ import annotations

import threading

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np
import pytest

import jgnn
from jgnn.sampling import ClusterLoader, NeighborLoader, Prefetcher, in_csr, partition, sample_neighbors

N, E, F = 80, 400, 6


def _graph(seed: int = 0):
    """A directed random graph with duplicate edges, self-loops and nodes without in-edges, skewed degrees."""
    rng = np.random.default_rng(seed)
    receivers = np.minimum(rng.geometric(0.05, E) - 1, N - 11)  # nodes N-10.. have no in-edges
    senders = rng.integers(0, N, E)
    x = rng.normal(size=(N, F)).astype(np.float32)
    labels = rng.integers(0, 3, N)
    return senders, receivers, x, labels


def test_sampled_edges_exist_and_fanouts_hold():
    senders, receivers, _, _ = _graph()
    csr = in_csr(senders, receivers, N)
    degree = np.bincount(receivers, minlength=N)
    fanouts = [4, 3]
    rng = np.random.default_rng(0)
    for _ in range(5):
        seeds = rng.choice(N, 16, replace=False)
        sub = sample_neighbors(csr, seeds, fanouts, rng)
        ids = sub.node_ids
        assert np.array_equal(ids[:16], seeds) and np.unique(ids).shape == ids.shape
        # every sampled edge is the edge of the full graph that its id names, and none repeats
        assert np.array_equal(senders[sub.edge_ids], ids[sub.senders])
        assert np.array_equal(receivers[sub.edge_ids], ids[sub.receivers])
        assert np.unique(sub.edge_ids).shape == sub.edge_ids.shape
        hop = np.repeat(np.arange(len(sub.num_sampled_nodes)), sub.num_sampled_nodes)
        count = np.bincount(sub.receivers, minlength=ids.shape[0])
        expanded = hop < len(fanouts)
        want = np.minimum(degree[ids[expanded]], np.array(fanouts)[hop[expanded]])
        assert np.array_equal(count[expanded], want)  # all in-edges when degree <= fan-out, else exactly fan-out
        assert not count[~expanded].any()
        assert set(ids[hop == 1]) == set(senders[sub.edge_ids[hop[sub.receivers] == 0]]) - set(seeds)


def test_all_neighbours_fanout_takes_every_in_edge():
    senders, receivers, _, _ = _graph()
    sub = sample_neighbors(in_csr(senders, receivers, N), np.array([0, 1]), [-1], np.random.default_rng(0))
    want = np.flatnonzero(np.isin(receivers, [0, 1]))
    assert np.array_equal(np.sort(sub.edge_ids), want)


class _SAGE(nn.Module):
    @nn.compact
    def __call__(self, graph):
        h = jax.nn.relu(jgnn.nn.SAGEConv(8)(graph).nodes)
        return jgnn.nn.SAGEConv(3)(graph._replace(nodes=h)).nodes


def _full_graph(senders, receivers, x):
    return jraph.GraphsTuple(nodes=jnp.asarray(x), edges=None, senders=jnp.asarray(senders, jnp.int32),
                             receivers=jnp.asarray(receivers, jnp.int32), n_node=jnp.array([N]),
                             n_edge=jnp.array([E]), globals=None)


def test_full_fanout_two_layers_equal_the_full_graph_on_seeds_forward_and_grad():
    senders, receivers, x, _ = _graph()
    max_degree = int(np.bincount(receivers).max())
    loader = NeighborLoader(in_csr(senders, receivers, N), np.arange(N), [max_degree, max_degree], batch_size=24,
                            features=x, seed=3, prefetch=0)
    model, full = _SAGE(), _full_graph(senders, receivers, x)
    params = model.init(jax.random.key(0), full)
    weights = jax.random.normal(jax.random.key(1), (N, 3))

    def loss(params, graph, ids, mask):  # a weighted sum of the seed rows' outputs, padding masked out
        out = model.apply(params, graph)
        return jnp.sum(jnp.where(mask[:, None], out * weights[jnp.maximum(ids, 0)], 0.0))

    full_out = model.apply(params, full)
    seen = np.zeros(N, bool)
    for batch in loader:
        graph = jax.tree_util.tree_map(jnp.asarray, batch.graph)
        seeds = batch.node_ids[batch.mask]
        seen[seeds] = True
        out = model.apply(params, graph)
        np.testing.assert_allclose(out[batch.mask], full_out[seeds], rtol=1e-5, atol=1e-5)
        full_mask = np.isin(np.arange(N), seeds)
        got = jax.grad(loss)(params, graph, jnp.asarray(batch.node_ids), jnp.asarray(batch.mask))
        want = jax.grad(loss)(params, full, jnp.arange(N), jnp.asarray(full_mask))
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), got, want)
    assert seen.all()


def test_padding_follows_jraph_conventions():
    senders, receivers, x, labels = _graph()
    loader = NeighborLoader(in_csr(senders, receivers, N), np.arange(N), [3, 2], batch_size=16, features=x,
                            labels=labels, prefetch=0)
    for batch in loader:
        g, (n, pad_n), (e, pad_e) = batch.graph, batch.graph.n_node, batch.graph.n_edge
        assert n + pad_n == loader.node_budget == g.nodes.shape[0] and pad_n >= 1
        assert e + pad_e == loader.edge_budget == g.senders.shape[0]
        assert np.all(g.senders[e:] == n) and np.all(g.receivers[e:] == n)  # into the first padding node
        assert np.all(g.senders[:e] < n) and np.all(g.receivers[:e] < n)
        assert np.array_equal(np.asarray(jraph.get_node_padding_mask(g)), batch.node_ids >= 0)
        assert not g.nodes[n:].any() and np.all(batch.edge_ids[e:] == -1)
        np.testing.assert_array_equal(g.nodes[:n], x[batch.node_ids[:n]])
        np.testing.assert_array_equal(batch.labels[:n], labels[batch.node_ids[:n]])
        assert np.array_equal(np.flatnonzero(batch.mask), np.arange(int(batch.mask.sum())))  # seeds first


def test_fixed_shapes_compile_once():
    senders, receivers, x, _ = _graph()
    loader = NeighborLoader(in_csr(senders, receivers, N), np.arange(N), [5, 5], batch_size=24, features=x,
                            prefetch=0)  # 80 = 3 x 24 + 8: the last batch is smaller and still has the same shape
    traces = []

    @jax.jit
    def step(graph, mask):
        traces.append(1)
        return jnp.sum(jnp.where(mask, jraph.segment_sum(graph.nodes[graph.senders, 0], graph.receivers,
                                                         graph.nodes.shape[0]), 0.0))

    for epoch in range(2):
        for batch in loader.epoch(epoch):
            step(batch.graph, batch.mask)
    assert len(loader) == 4 and len(traces) == 1


def _same(a, b) -> bool:
    leaves = jax.tree_util.tree_leaves
    return all(np.array_equal(p, q) for p, q in zip(leaves(a), leaves(b), strict=True))


def test_epochs_are_deterministic_under_the_seed():
    senders, receivers, x, _ = _graph()
    csr = in_csr(senders, receivers, N)
    make = lambda seed: NeighborLoader(csr, np.arange(N), [3, 2], batch_size=16, features=x, seed=seed)
    a, b, c = make(0), make(0), make(1)
    first = list(a.epoch(0))
    assert all(_same(p, q) for p, q in zip(first, b.epoch(0), strict=True))
    assert not all(_same(p, q) for p, q in zip(first, a.epoch(1), strict=True))
    assert not all(_same(p, q) for p, q in zip(first, c.epoch(0), strict=True))
    assert all(_same(p, q) for p, q in zip(first, iter(b), strict=True))  # iterating runs epoch 0 first


def test_prefetch_reraises_the_producer_error_and_stops():
    def produce():
        yield from range(3)
        raise KeyError("producer failed")

    prefetcher = Prefetcher(produce, size=1)
    got = []
    with pytest.raises(KeyError, match="producer failed"):
        for item in prefetcher:
            got.append(item)
    assert got == [0, 1, 2] and not prefetcher.thread.is_alive()


def test_prefetch_stops_when_the_consumer_leaves_early():
    produced = []

    def produce():
        for i in range(1000):
            produced.append(i)
            yield i

    prefetcher = Prefetcher(produce, size=2)
    items = iter(prefetcher)
    assert next(items) == 0
    items.close()
    assert not prefetcher.thread.is_alive() and len(produced) <= 4
    assert not any(t.name == "jgnn-prefetch" and t.is_alive() for t in threading.enumerate())


def test_prefetched_loader_yields_the_same_batches():
    senders, receivers, x, _ = _graph()
    csr = in_csr(senders, receivers, N)
    kwargs = dict(batch_size=16, features=x, seed=5)
    plain = list(NeighborLoader(csr, np.arange(N), [3, 2], prefetch=0, **kwargs).epoch(2))
    ahead = list(NeighborLoader(csr, np.arange(N), [3, 2], prefetch=2, progress=True, **kwargs).epoch(2))
    assert len(plain) == 5 and all(_same(p, q) for p, q in zip(plain, ahead, strict=True))


@pytest.mark.parametrize("method", ["bfs", "metis"])
def test_partition_is_deterministic_and_balanced(method):
    if method == "metis":
        pytest.importorskip("pymetis")
    senders, receivers, _, _ = _graph()
    parts = partition(in_csr(senders, receivers, N), 5, method=method)
    assert parts.shape == (N,) and set(parts) == set(range(5))
    assert np.array_equal(parts, partition(in_csr(senders, receivers, N), 5, method=method))
    if method == "bfs":
        assert np.bincount(parts).max() - np.bincount(parts).min() <= 1


def test_cluster_batches_are_the_induced_subgraphs_of_q_clusters():
    senders, receivers, x, labels = _graph()
    csr = in_csr(senders, receivers, N)
    parts = partition(csr, 6, method="bfs")
    train = np.random.default_rng(0).random(N) < 0.5
    loader = ClusterLoader(csr, parts, clusters_per_batch=2, features=x, labels=labels, mask=train, seed=1)
    for epoch in range(2):
        covered, shapes = [], set()
        for batch in loader.epoch(epoch):
            g, n, e = batch.graph, int(batch.graph.n_node[0]), int(batch.graph.n_edge[0])
            ids = batch.node_ids[:n]
            covered.append(ids)
            assert len(set(parts[ids])) == 2
            inside = np.isin(senders, ids) & np.isin(receivers, ids)
            assert np.array_equal(np.sort(batch.edge_ids[:e]), np.flatnonzero(inside))
            assert np.array_equal(ids[g.senders[:e]], senders[batch.edge_ids[:e]])
            assert np.array_equal(ids[g.receivers[:e]], receivers[batch.edge_ids[:e]])
            assert np.array_equal(batch.mask[:n], train[ids]) and not batch.mask[n:].any()
            shapes.add((g.nodes.shape, g.senders.shape))
        assert np.array_equal(np.sort(np.concatenate(covered)), np.arange(N)) and len(shapes) == 1
    assert not all(_same(p, q) for p, q in zip(loader.epoch(0), loader.epoch(1), strict=True))


@pytest.mark.parametrize("call, message", [
    (lambda csr: sample_neighbors(csr, [0, 0], [2], np.random.default_rng(0)), "distinct"),
    (lambda csr: sample_neighbors(csr, [0], [0], np.random.default_rng(0)), "fanouts"),
    (lambda csr: sample_neighbors(csr, [N], [2], np.random.default_rng(0)), "outside"),
    (lambda csr: in_csr([0, 1], [N, 0], N), "receivers"),
    (lambda csr: partition(csr, 0), "num_parts"),
    (lambda csr: ClusterLoader(csr, np.zeros(N, int), clusters_per_batch=2), "clusters_per_batch"),
    (lambda csr: NeighborLoader(csr, [0], [2], batch_size=1, node_budget=2, prefetch=0).epoch(0).__next__(),
     "does not fit"),
])
def test_bad_input_is_named(call, message):
    senders, receivers, _, _ = _graph()
    with pytest.raises(ValueError, match=message):
        call(in_csr(senders, receivers, N))


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["neighbor", "cluster"])
def test_train_sampled_example_compiles_its_step_once(loader, data_dir):
    import json
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    env = {**os.environ, "JGNN_DATA_DIR": str(data_dir), "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
           "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, str(root / "examples" / "train_sampled.py"), "--smoke", "--no-progress",
                           "--loader", loader], capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["compiles"] == 1 and 0.0 <= out["test_accuracy"] <= 1.0
    assert (out["train_nodes"], out["val_nodes"]) == (200, 300)  # 20 and 30 per class, 10 classes
