"""`GraphLayout`: the sorted edge structures the fused kernels walk, built once on the host.

Holds the destination-sorted CSR (row pointers, source ids, edge ids, degree ordering) and the source-sorted
reverse CSR the backward passes use. For a typed graph it also holds the unique (source, edge type) pairs
(`TypedPairs`), over which Hector's compact materialisation computes typed messages once per pair.
Padding edges of ``jraph.pad_with_graphs`` are excluded from the CSRs so they never form a fake hub. Pass a
layout to a layer (``layer(graph, layout=layout)``) or a compiled function; without it the fused ops sort
the edges inside the program on every call, which `explain` reports.

Layers that append one ``i -> i`` edge per node (``jgnn.nn.GCNConv``, ``GATConv``, ...) run on a larger graph
than the one they are given: ``GraphLayout.from_graph(graph, self_loops=True)`` describes that graph. The loops
are appended by `append_self_loops`, the one place that fixes their order, so layouts and layers agree.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import jraph
import numpy as np

import pallas_kernels as pk
from jgnn import graph as graph_lib


class TypedPairs(NamedTuple):
    """The unique (source node, edge type) pairs of a typed graph: ``edge_pair[e]`` indexes them."""

    pair_src: np.ndarray  # int32 [U]
    pair_type: np.ndarray  # int32 [U]
    edge_pair: np.ndarray  # int32 [E]

    @classmethod
    def from_edges(cls, senders, types) -> TypedPairs:
        senders, types = np.asarray(senders, np.int64), np.asarray(types, np.int64)
        keys = types * (int(senders.max(initial=0)) + 1) + senders  # sorted by type, then source
        unique, edge_pair = np.unique(keys, return_inverse=True)
        base = int(senders.max(initial=0)) + 1
        return cls((unique % base).astype(np.int32), (unique // base).astype(np.int32),
                   edge_pair.astype(np.int32).reshape(-1))


def append_self_loops(senders, receivers, n_node, n_edge, num_nodes: int):
    """The edge list with one ``i -> i`` edge appended per node, and the permutation that orders it.

    Args:
      senders, receivers: int ``[E]``.
      n_node, n_edge: int ``[G]`` per-graph counts (jraph batching; ``G`` is static, the values may be traced).
      num_nodes: ``N``, the static number of nodes.

    Returns ``(senders', receivers', order)``: int32 ``[E + N]`` arrays, and ``order`` (int ``[E + N]``, or
    ``None`` for a single graph) such that ``concatenate([per_edge, per_node])[order]`` lays out any per-edge
    array like the new edges. The loops follow the existing edges; with several graphs a stable sort by graph
    id keeps each graph's edges contiguous, as jraph's batching and padding masks expect. Works on numpy and
    jax arrays, traced ones included.
    """
    num_edges = int(np.shape(senders)[0])
    loop = jnp.arange(num_nodes, dtype=jnp.int32)
    senders = jnp.concatenate([jnp.asarray(senders, jnp.int32), loop])
    receivers = jnp.concatenate([jnp.asarray(receivers, jnp.int32), loop])
    num_graphs = int(np.shape(n_node)[0])
    if num_graphs == 1:
        return senders, receivers, None
    graph_ids = jnp.arange(num_graphs)
    edge_graph = jnp.concatenate([jnp.repeat(graph_ids, n_edge, total_repeat_length=num_edges),
                                  jnp.repeat(graph_ids, n_node, total_repeat_length=num_nodes)])
    order = jnp.argsort(edge_graph, stable=True)
    return senders[order], receivers[order], order


def with_self_loops(graph: jraph.GraphsTuple) -> jraph.GraphsTuple:
    """``graph``'s edge structure with `append_self_loops` applied (``n_edge`` grows by ``n_node``).

    Only ``senders``, ``receivers`` and ``n_edge`` change; ``edges`` is dropped (see
    ``jgnn.nn.add_self_loops`` for the layer-side version that also extends edge features).
    """
    n = graph_lib.num_nodes(graph)
    senders, receivers, _ = append_self_loops(graph.senders, graph.receivers, graph.n_node, graph.n_edge, n)
    return graph._replace(senders=senders, receivers=receivers, edges=None,
                          n_edge=graph.n_edge + jnp.asarray(graph.n_node, jnp.result_type(graph.n_edge)))


class GraphLayout(NamedTuple):
    """Sorted edge structures of one graph, built on the host (see the module docstring).

    ``self_loops`` is static metadata, not an array: whether the layout describes the graph with one
    ``i -> i`` edge appended per node (`append_self_loops`). Layers check it against what they run on.
    """

    csr: pk.CSR
    rev_csr: pk.CSR
    pairs: TypedPairs | None = None
    self_loops: bool = False

    @classmethod
    def from_graph(cls, graph: jraph.GraphsTuple, *, padded: bool = False, self_loops: bool = False) -> GraphLayout:
        """Build on the host with numpy.

        ``padded=True`` drops the padding graph's edges (jraph convention). ``self_loops=True`` describes the
        graph plus one ``i -> i`` edge per node, appended as the ``jgnn.nn`` layers that add self-loops do.
        """
        if self_loops:
            graph = with_self_loops(graph)
        n = graph_lib.num_nodes(graph)
        valid = np.asarray(jraph.get_edge_padding_mask(graph)) if padded else None
        csr, rev = pk.build_csr_numpy(np.asarray(graph.senders), np.asarray(graph.receivers), n, valid)
        types = graph_lib.edge_types(graph)
        pairs = None if types is None else TypedPairs.from_edges(graph.senders, types)
        return cls(csr, rev, pairs, self_loops)


# `self_loops` is static: it lives in the treedef, so jit and the compiler never turn it into an array.
jax.tree_util.register_pytree_node(
    GraphLayout, lambda lay: ((lay.csr, lay.rev_csr, lay.pairs), lay.self_loops),
    lambda self_loops, children: GraphLayout(*children, self_loops=self_loops))


def in_program(senders, receivers, num_nodes: int) -> GraphLayout:
    """The same layout built with traced sorts (used when no layout was passed)."""
    csr, rev = pk.build_csr_jax(senders, receivers, num_nodes)
    return GraphLayout(csr, rev)
