"""Random graphs with the cases every rewrite and kernel must survive.

Isolated nodes, duplicate edges, a hub, jraph padding, typed nodes and edges. Fresh randomness per call.
"""

from __future__ import annotations

import jax.numpy as jnp
import jraph
import numpy as np


def random_edges(rng: np.random.Generator, n: int, e: int, *, isolated: int = 2, hub: int = 0,
                 duplicates: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """``e`` edges among the first ``n - isolated`` nodes (the last ``isolated`` ones get none)."""
    live = max(n - isolated, 1)
    senders = rng.integers(0, live, e)
    receivers = rng.integers(0, live, e)
    if hub:  # many in-edges on node 0
        receivers[:hub] = 0
    if duplicates and e > 2 * duplicates:
        senders[-duplicates:], receivers[-duplicates:] = senders[:duplicates], receivers[:duplicates]
    return senders.astype(np.int32), receivers.astype(np.int32)


def random_graph(rng: np.random.Generator, n: int = 13, e: int = 40, d: int = 7, *, d_edge: int = 0,
                 node_types: int = 0, edge_types: int = 0, isolated: int = 2, hub: int = 0,
                 duplicates: int = 2, dtype=jnp.float32, globals_dim: int = 0,
                 n_graphs: int = 1) -> jraph.GraphsTuple:
    """A graph (or a batch of ``n_graphs`` graphs) with float features ``h`` [n, d]."""
    senders, receivers = random_edges(rng, n, e, isolated=isolated, hub=hub, duplicates=duplicates)
    h = jnp.asarray(rng.normal(size=(n, d)), dtype)
    nodes = {"h": h}
    edges = None
    if node_types:
        nodes["type"] = jnp.asarray(rng.integers(0, node_types, n), jnp.int32)
    if d_edge or edge_types:
        edges = {}
        if d_edge:
            edges["x"] = jnp.asarray(rng.normal(size=(e, d_edge)), dtype)
        if edge_types:
            edges["type"] = jnp.asarray(rng.integers(0, edge_types, e), jnp.int32)
    if n_graphs > 1:  # split nodes evenly; keep each graph's edges inside it by remapping
        sizes = np.full(n_graphs, n // n_graphs)
        sizes[-1] += n - sizes.sum()
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        graph_of_edge = np.sort(rng.integers(0, n_graphs, e))
        senders = (starts[graph_of_edge] + senders % sizes[graph_of_edge]).astype(np.int32)
        receivers = (starts[graph_of_edge] + receivers % sizes[graph_of_edge]).astype(np.int32)
        n_node, n_edge = sizes, np.bincount(graph_of_edge, minlength=n_graphs)
    else:
        n_node, n_edge = np.array([n]), np.array([e])
    glob = jnp.asarray(rng.normal(size=(n_graphs, globals_dim)), dtype) if globals_dim else None
    return jraph.GraphsTuple(nodes=nodes, edges=edges, senders=jnp.asarray(senders),
                             receivers=jnp.asarray(receivers), n_node=jnp.asarray(n_node, jnp.int32),
                             n_edge=jnp.asarray(n_edge, jnp.int32), globals=glob)


def pad(graph: jraph.GraphsTuple, extra_nodes: int = 3, extra_edges: int = 5) -> jraph.GraphsTuple:
    """jraph's padding: one extra graph holding the padding nodes and edges."""
    n = int(np.sum(graph.n_node)) + extra_nodes
    e = int(np.sum(graph.n_edge)) + extra_edges
    return jraph.pad_with_graphs(graph, n_node=n, n_edge=e, n_graph=int(graph.n_node.shape[0]) + 1)


def real_nodes(graph: jraph.GraphsTuple) -> np.ndarray:
    return np.asarray(jraph.get_node_padding_mask(graph))
