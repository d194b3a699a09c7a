"""Helpers shared by the `jgnn.nn` modules: node-feature access, self-loops and degrees.

Everything that touches edges goes through `jgnn.message_passing`, so the compiler sees it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jraph

import pallas_kernels as pk
from jgnn import graph as graph_lib
from jgnn import mailbox
from jgnn.message_passing import message_passing

FEATURE_KEY = "h"


def node_features(graph: jraph.GraphsTuple):
    """The node feature array: ``graph.nodes`` itself, or ``graph.nodes["h"]`` for dict-valued nodes."""
    nodes = graph.nodes
    if isinstance(nodes, Mapping):
        if FEATURE_KEY not in nodes:
            raise ValueError(f'graph.nodes is a dict without a "{FEATURE_KEY}" feature entry (keys: {sorted(nodes)})')
        return nodes[FEATURE_KEY]
    if nodes is None:
        raise ValueError("graph.nodes is None: this module needs node features")
    return nodes


def with_features(graph: jraph.GraphsTuple, x) -> jraph.GraphsTuple:
    """``graph`` with its node features replaced by ``x``, keeping the input's form (array or dict)."""
    if isinstance(graph.nodes, Mapping):
        return graph._replace(nodes={**graph.nodes, FEATURE_KEY: x})
    return graph._replace(nodes=x)


def add_self_loops(graph: jraph.GraphsTuple, *, edge_type: int | None = None) -> jraph.GraphsTuple:
    """Append one edge ``i -> i`` per node (existing self-loops are kept, as PyG's ``add_self_loops``).

    ``n_edge`` grows by ``n_node`` graph by graph; for batches of several graphs the edges are reordered so
    each graph's edges stay contiguous (jraph's convention, which padding masks rely on). Edge features of the
    new edges are zero, except ``edges["type"]`` which is ``edge_type`` (required when the graph is typed).
    """
    n = graph_lib.num_nodes(graph)
    e = graph_lib.num_edges(graph)
    loop = jnp.arange(n, dtype=jnp.int32)
    senders = jnp.concatenate([graph.senders, loop])
    receivers = jnp.concatenate([graph.receivers, loop])
    edges = graph.edges
    if edges is not None:
        def extend(path, x):
            key = getattr(path[-1], "key", None) if path else None
            if key == graph_lib.TYPE_KEY and isinstance(edges, Mapping):
                if edge_type is None:
                    raise ValueError("typed graph: add_self_loops needs the self-loop relation id (edge_type=)")
                fill = jnp.full((n,) + x.shape[1:], edge_type, x.dtype)
            else:
                fill = jnp.zeros((n,) + x.shape[1:], x.dtype)
            return jnp.concatenate([x, fill])

        edges = jax.tree_util.tree_map_with_path(extend, edges)
    elif edge_type is not None:
        edges = {graph_lib.TYPE_KEY: jnp.concatenate([jnp.zeros((e,), jnp.int32),
                                                      jnp.full((n,), edge_type, jnp.int32)])}
    n_edge = graph.n_edge + graph.n_node.astype(graph.n_edge.dtype)
    num_graphs = graph.n_node.shape[0]
    if num_graphs > 1:  # keep each graph's edges contiguous: stable sort by graph id
        graph_ids = jnp.arange(num_graphs)
        edge_graph = jnp.concatenate([jnp.repeat(graph_ids, graph.n_edge, total_repeat_length=e),
                                      jnp.repeat(graph_ids, graph.n_node, total_repeat_length=n)])
        order = jnp.argsort(edge_graph, stable=True)
        senders, receivers = senders[order], receivers[order]
        edges = jax.tree_util.tree_map(lambda x: x[order], edges)
    return graph._replace(senders=senders, receivers=receivers, edges=edges, n_edge=n_edge)


def _count_phi(src, dst, edge):
    return jnp.ones((), jnp.float32)


def in_degree(graph: jraph.GraphsTuple, *, backend: str = "auto", remat: str = "auto"):
    """In-degree of every node (number of incoming edges), as float32 [N], computed by message passing."""
    layer = message_passing(_count_phi, lambda mb, node: mailbox.sum(mb), lambda node, agg: agg,
                            backend=backend, remat=remat)
    probe = graph._replace(nodes=jnp.zeros((graph_lib.num_nodes(graph),), jnp.float32), edges=None)
    return layer(probe).nodes


def in_degree_per_type(graph: jraph.GraphsTuple, num_types: int, *, backend: str = "auto",
                       remat: str = "auto"):
    """``[N, num_types]`` float32: how many incoming edges of each type every node has (message passing)."""
    phi = lambda src, dst, edge: jax.nn.one_hot(edge[graph_lib.TYPE_KEY], num_types, dtype=jnp.float32)
    layer = message_passing(phi, lambda mb, node: mailbox.sum(mb), lambda node, agg: agg,
                            backend=backend, remat=remat)
    probe = graph._replace(nodes=jnp.zeros((graph_lib.num_nodes(graph),), jnp.float32),
                           edges={graph_lib.TYPE_KEY: graph_lib.edge_types(graph)})
    return layer(probe).nodes


class AttentionDropout(NamedTuple):
    """Counter-based attention dropout: the keep mask is a hash of (seed, edge id, head).

    Nothing edge-sized is drawn or stored: phi recomputes the mask from the int32 edge id, so the backward
    pass (which recomputes edge values) sees the same mask as the forward, and the Pallas kernels use the
    same hash (`pallas_kernels.edge_dropout_keep`).
    """

    seed: jax.Array
    rate: float

    def edge_features(self, num_edges: int) -> dict:
        return {"dropout_id": jnp.arange(num_edges, dtype=jnp.int32)}

    def scale(self, edge, heads: int) -> jax.Array:
        """Inverted-dropout scale ``keep / (1 - rate)`` for one edge's ``heads`` attention weights."""
        if self.rate >= 1.0:
            return jnp.zeros((heads,), jnp.float32)
        keep = pk.edge_dropout_keep(self.seed, edge["dropout_id"], jnp.arange(heads, dtype=jnp.int32), self.rate)
        return keep.astype(jnp.float32) / (1.0 - self.rate)


def attention_dropout(module, rate: float, deterministic: bool) -> AttentionDropout | None:
    """The module's attention dropout for this call, or ``None`` when it is off."""
    if deterministic or rate <= 0.0:
        return None
    seed = jax.random.randint(module.make_rng("dropout"), (), 0, jnp.iinfo(jnp.int32).max, jnp.int32)
    return AttentionDropout(seed, float(rate))
